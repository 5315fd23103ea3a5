// The JavaScript side of the WASM trainer, shared by node (wasm/node_run.mjs, the tests and the
// benchmark) and the browser's Web Worker (wasm/worker.js): load a build, hand it a model shape,
// training tokens and optionally weights, and read results out of its memory.
//
// Every tg_* call that can fail returns nonzero and leaves a message in tg_error(); here that
// becomes a thrown Error with the message, so a page can print it.

export const BUILDS = {
  scalar: "tinygpt-scalar.mjs",
  simd: "tinygpt-simd.mjs",
  threads: "tinygpt-threads.mjs",
  relaxed: "tinygpt-relaxed.mjs",  // zig's builds, with freestanding_loader.mjs for a runtime
  "relaxed-threads": "tinygpt-relaxed-threads.mjs",
};

export class Trainer {
  // `factory` is a build's default export (createTinyGPT); `options` go to the module (threads,
  // locateFile, mainScriptUrlOrBlob, wasmBinary: whatever the environment needs).
  static async load(factory, options = {}) {
    const mod = await factory({print: () => {}, printErr: () => {}, ...options});
    return new Trainer(mod);
  }

  constructor(mod) {
    this.mod = mod;
  }

  check(code, what) {
    if (code !== 0) throw new Error(`${what}: ${this.mod.UTF8ToString(this.mod._tg_error())}`);
  }

  // config: {vocab, block, layers, heads, embd, batch}
  create(config, threads = 1, seed = 0) {
    const c = config;
    this.check(this.mod._tg_create(c.vocab, c.block, c.layers, c.heads, c.embd, c.batch, threads, seed), "create");
    this.config = {...config};
    this.threads = this.mod._tg_threads();
    this.nParams = Number(this.mod._tg_n_params());
  }

  // copy `bytes` (a Uint8Array or typed array) into a fresh allocation and call fn(pointer, n)
  withBytes(bytes, fn) {
    const u8 = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const ptr = this.mod._malloc(Math.max(1, u8.length));
    if (!ptr) throw new Error(`out of memory: could not copy ${u8.length} bytes into the module`);
    try {
      this.mod.HEAPU8.set(u8, ptr);
      return fn(ptr, u8.length);
    } finally {
      this.mod._free(ptr);
    }
  }

  loadWeights(bytes) {
    this.withBytes(bytes, (ptr, n) => this.check(this.mod._tg_load(ptr, n), "weights"));
  }

  setTokens(ids, seed = 0) {
    const u16 = ids instanceof Uint16Array ? ids : Uint16Array.from(ids);
    this.withBytes(u16, (ptr) => this.check(this.mod._tg_set_tokens(ptr, u16.length, seed), "tokens"));
  }

  setAdamW({lr = 3e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0} = {}) {
    this.check(this.mod._tg_set_adamw(lr, beta1, beta2, eps, weightDecay), "AdamW");
  }

  step() {
    const loss = this.mod._tg_step();
    if (Number.isNaN(loss)) throw new Error(`step: ${this.mod.UTF8ToString(this.mod._tg_error())}`);
    return loss;
  }

  // loss and gradients for one given batch (Int32Arrays of batch * block ids), no update
  lossAndGrads(inputs, targets) {
    const loss = this.withBytes(Int32Array.from(inputs), (x) =>
      this.withBytes(Int32Array.from(targets), (y) => this.mod._tg_loss_and_grads(x, y)));
    if (Number.isNaN(loss)) throw new Error(`batch: ${this.mod.UTF8ToString(this.mod._tg_error())}`);
    return loss;
  }

  floats(pointer, count) {
    return new Float32Array(this.mod.HEAPF32.buffer, pointer, count).slice();
  }

  params() {
    return this.floats(this.mod._tg_params(), this.nParams);
  }

  grads() {
    return this.floats(this.mod._tg_grads(), this.nParams);
  }

  logits() {
    const c = this.config;
    return this.floats(this.mod._tg_logits(), c.batch * c.block * c.vocab);
  }

  // the inputs of the batch the last step trained on
  lastBatch() {
    const c = this.config;
    return new Int32Array(this.mod.HEAP32.buffer, this.mod._tg_batch_inputs(), c.batch * c.block).slice();
  }

  // n x n x n products on the model's threads: {seconds per product, maxError on sampled entries}
  benchGemm(n, reps) {
    // warm-up: the engine first runs new code from a quick compile and swaps in an optimised one
    // once the code is hot, so run until that has surely happened (small products need many calls)
    for (const start = performance.now(); performance.now() - start < 300;) this.mod._tg_bench_gemm(n, n, n, reps);
    const start = performance.now();
    const maxError = this.mod._tg_bench_gemm(n, n, n, reps);
    const seconds = (performance.now() - start) / 1000 / reps;
    if (maxError < 0) throw new Error(`bench_gemm: ${this.mod.UTF8ToString(this.mod._tg_error())}`);
    return {seconds, maxError};
  }

  generate(prompt, count, temperature = 0.8, seed = 0) {
    const room = new Int32Array(prompt.length + count);
    room.set(prompt);
    return this.withBytes(room, (ptr) => {
      this.check(this.mod._tg_generate(ptr, prompt.length, count, temperature, seed), "generate");
      return Array.from(new Int32Array(this.mod.HEAP32.buffer, ptr, room.length));
    });
  }
}
