// Emscripten 3.1.6's ES-module output still uses CommonJS's `require` and `__dirname` under
// node; an ES module has neither, so define them here (placed before the module factory with
// --extern-pre-js). In a browser `process` does not exist and nothing happens.
const IS_NODE = typeof process == "object" && typeof process.versions == "object" && !!process.versions.node;
var require = IS_NODE ? (await import("node:module")).createRequire(import.meta.url) : undefined;
var __dirname = IS_NODE ? (await import("node:path")).dirname((await import("node:url")).fileURLToPath(import.meta.url)) : "";
