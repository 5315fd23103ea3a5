// The Web Worker that trains the tiny GPT for the browser cell (wasm/cell.js), so the page stays
// responsive while it runs. It is a module worker; everything it loads arrives as blob: URLs.
//
// in:  {cmd: "train", urls: {trainer, build, workers: {file name: url}}, wasm, threads, config,
//       tokens, seed, lr, steps, prompt, sampleLength}   and   {cmd: "stop"}
// out: {kind: "ready" | "step" | "done" | "error", ...}
let stopping = false;

self.onmessage = async ({data}) => {
  if (data.cmd === "stop") {
    stopping = true;
    return;
  }
  if (data.cmd !== "train") return;
  try {
    const {Trainer} = await import(data.urls.trainer);
    const {default: factory} = await import(data.urls.build);
    const trainer = await Trainer.load(factory, {
      threads: data.threads,
      wasmBinary: data.wasm,
      // a threaded build's workers load their own script by URL (Emscripten's also the build's)
      mainScriptUrlOrBlob: data.urls.build,
      locateFile: (name) => data.urls.workers[name] ?? name,
    });
    trainer.create(data.config, data.threads, data.seed);
    trainer.setTokens(data.tokens, data.seed);
    trainer.setAdamW({lr: data.lr});
    self.postMessage({kind: "ready", threads: trainer.threads, nParams: trainer.nParams});
    const tokensPerStep = data.config.batch * data.config.block;
    const start = performance.now();
    for (let step = 1; step <= data.steps && !stopping; step++) {
      const loss = trainer.step();
      const seconds = (performance.now() - start) / 1000;
      self.postMessage({kind: "step", step, loss, tokensPerSecond: (step * tokensPerStep) / seconds});
      await new Promise((resolve) => setTimeout(resolve, 0));  // lets a "stop" message in
    }
    const sample = trainer.generate(data.prompt, data.sampleLength, 0.8, data.seed);
    self.postMessage({kind: "done", sample, stopped: stopping});
  } catch (err) {
    self.postMessage({kind: "error", message: err.message || String(err)});
  }
};
