// A worker of the threaded freestanding build (freestanding_loader.mjs starts it): it instantiates
// the module on the shared memory, moves its stack to the block the loader allocated for it, joins
// the pool, says so, and then serves parallel loops until it is terminated. Under node it is a
// worker_threads Worker, in a browser a module Web Worker.
const node = Boolean(globalThis.process?.versions?.node);
const port = node ? (await import("node:worker_threads")).parentPort : self;

function listen(handler) {
  if (node) port.once("message", handler);
  else self.onmessage = ({data}) => handler(data);
}

listen(({module, memory, stackTop}) => {
  try {
    const {exports} = new WebAssembly.Instance(module, {env: {memory}});
    exports.tg_set_stack(stackTop);
    const id = exports.tg_worker_join();
    port.postMessage({ready: id});
    exports.tg_worker_serve(id);  // never returns
  } catch (err) {
    port.postMessage({error: err.message || String(err)});
  }
});
