// Run the WASM trainer under node on a job file and print the results as JSON. The Python side
// (posttrainllm.wasm.run_node) writes the job and reads the answer:
//
//   node --no-experimental-fetch wasm/node_run.mjs job.json
//
// job: {build, dist, config, threads, seed, weights?, tokens, token_seed, adamw, steps,
//       batch?: {inputs, targets}, bench_gemm?: {sizes, reps}, out?}
// Files are raw little-endian arrays: tokens uint16, batch int32, weights in the PTLGPT1 format.
// With `out`, params.f32 (after training), and for `batch` grads.f32 and logits.f32, land there.
import {readFileSync, writeFileSync} from "node:fs";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

import {BUILDS, Trainer} from "./trainer.mjs";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const answer = {};
try {
  const file = BUILDS[job.build];
  if (!file) throw new Error(`no build ${job.build}; the builds are ${Object.keys(BUILDS)}`);
  const {default: factory} = await import(pathToFileURL(join(job.dist, file)).href);
  // a plain path: the 3.1.6 runtime would otherwise hand node's fs a file: URL
  const trainer = await Trainer.load(factory, {threads: job.threads ?? 1, locateFile: (name) => join(job.dist, name)});
  trainer.create(job.config, job.threads ?? 1, job.seed ?? 0);
  answer.threads = trainer.threads;
  answer.n_params = trainer.nParams;
  if (job.weights) trainer.loadWeights(readFileSync(job.weights));
  trainer.setAdamW(job.adamw ?? {});
  if (job.batch) {
    const ints = (path) => new Int32Array(new Uint8Array(readFileSync(path)).buffer);
    answer.loss = trainer.lossAndGrads(ints(job.batch.inputs), ints(job.batch.targets));
    if (job.out) {
      writeFileSync(join(job.out, "grads.f32"), trainer.grads());
      writeFileSync(join(job.out, "logits.f32"), trainer.logits());
    }
  }
  if (job.tokens) {
    trainer.setTokens(new Uint16Array(new Uint8Array(readFileSync(job.tokens)).buffer), job.token_seed ?? 0);
    const losses = [];
    const start = process.hrtime.bigint();
    for (let s = 0; s < (job.steps ?? 0); s++) losses.push(trainer.step());
    answer.seconds = Number(process.hrtime.bigint() - start) / 1e9;
    answer.losses = losses;
    if (job.steps) answer.last_batch = Array.from(trainer.lastBatch().slice(0, job.config.block));
  }
  if (job.bench_gemm) {
    answer.gemm = job.bench_gemm.sizes.map((n) => ({n, ...trainer.benchGemm(n, job.bench_gemm.reps)}));
  }
  if (job.out) writeFileSync(join(job.out, "params.f32"), trainer.params());
} catch (err) {
  answer.error = err.message;
}
process.stdout.write(JSON.stringify(answer));
process.exit(0);  // the threaded build's workers would keep node alive
