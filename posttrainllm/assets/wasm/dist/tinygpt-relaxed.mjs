// The JavaScript side of a freestanding build of the trainer (zig's clang, no Emscripten runtime):
// it instantiates the .wasm and hands back an object shaped like an Emscripten module (the tg_*
// exports with a leading underscore, HEAP views, UTF8ToString), so trainer.mjs drives every build
// the same way. build.sh copies it to dist/ once per freestanding build, with its .wasm's name.
//
// A build that imports its memory is the threaded one: the memory is shared, and `options.threads
// - 1` workers (freestanding_worker.mjs, found through options.locateFile like the .wasm) each run
// an instance of the same module on it. It needs SharedArrayBuffer: a cross-origin isolated page.
const WASM_FILE = "tinygpt-relaxed.wasm";
const WORKER_FILE = "freestanding_worker.mjs";
const PAGE = 65536;
const INITIAL_BYTES = 16 << 20, MAX_BYTES = 1 << 30;  // as build.sh links the threaded build
const STACK_BYTES = 1 << 18;  // each worker's stack; the module's own first stack is 64 KB

async function binary(options) {
  if (options.wasmBinary) return options.wasmBinary;
  const path = options.locateFile ? options.locateFile(WASM_FILE) : WASM_FILE;
  if (globalThis.process?.versions?.node) return (await import("node:fs")).readFileSync(path);
  return (await fetch(path)).arrayBuffer();
}

export default async function createTinyGPT(options = {}) {
  const bytes = await binary(options);
  if (!WebAssembly.validate(bytes)) {
    throw new Error(`this WebAssembly engine cannot run ${WASM_FILE}: it needs SIMD and relaxed SIMD (and threads, ` +
      "for the threaded build); V8 has them by default from 11.4 (Chrome 114, node 22), and node 20 needs " +
      "--experimental-wasm-relaxed-simd");
  }
  const module = await WebAssembly.compile(bytes);
  const shared = WebAssembly.Module.imports(module).some((i) => i.kind === "memory");
  const memory = shared ? new WebAssembly.Memory({initial: INITIAL_BYTES / PAGE, maximum: MAX_BYTES / PAGE, shared})
                        : undefined;
  const instance = await WebAssembly.instantiate(module, shared ? {env: {memory}} : {});
  const exports = instance.exports;
  if (shared) await startWorkers(module, memory, exports, (options.threads | 0) - 1, options);
  const views = memory ?? exports.memory;  // views are made on each use: memory.grow replaces the buffer
  const mod = {
    get HEAPU8() { return new Uint8Array(views.buffer); },
    get HEAP32() { return new Int32Array(views.buffer); },
    get HEAPF32() { return new Float32Array(views.buffer); },
    UTF8ToString(pointer) {
      const bytes = new Uint8Array(views.buffer);
      let end = pointer;
      while (bytes[end]) end++;
      return new TextDecoder().decode(bytes.slice(pointer, end));  // a copy: decode() refuses shared memory
    },
  };
  for (const [name, value] of Object.entries(exports)) if (typeof value === "function") mod[`_${name}`] = value;
  return mod;
}

// Start `count` workers on the shared memory and wait until each has joined the pool, so that
// tg_create sees them all. Each gets its own stack, allocated here from the module's heap.
async function startWorkers(module, memory, exports, count, options) {
  const url = options.locateFile ? options.locateFile(WORKER_FILE) : WORKER_FILE;
  const node = Boolean(globalThis.process?.versions?.node);
  const {Worker: NodeWorker} = node ? await import("node:worker_threads") : {};
  const joins = [];
  for (let i = 0; i < count; i++) {
    const stack = exports.malloc(STACK_BYTES);
    if (!stack) throw new Error(`out of memory: no room for worker ${i + 1}'s stack`);
    const worker = node ? new NodeWorker(url) : new Worker(url, {type: "module"});
    joins.push(new Promise((resolve, reject) => {
      const answer = (data) => {
        if (data.error) return reject(new Error(`a trainer worker failed: ${data.error}`));
        if (node) worker.unref();  // it never finishes, and must not keep node running once it has joined
        resolve();
      };
      if (node) {
        worker.once("message", answer).once("error", reject);
      } else {
        worker.onmessage = ({data}) => answer(data);
        worker.onerror = (event) => reject(new Error(`a trainer worker failed: ${event.message}`));
      }
    }));
    worker.postMessage({module, memory, stackTop: stack + STACK_BYTES});
  }
  await Promise.all(joins);
}
