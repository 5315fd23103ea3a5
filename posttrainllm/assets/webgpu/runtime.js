// The browser's runtime for the book's WGSL kernels (webgpu/*.wgsl): device set-up with errors a
// reader can act on, pipelines whose bind group layouts come from the shader itself, dispatch,
// timing, readback, and CPU references to check the results against.
// posttrainllm/webgpu.py is the same runtime for Python (wgpu-py); both follow these rules:
// - parameters are `const NAME: u32 = 16u;` lines, rewritten before compiling;
// - a binding declared `var<storage, read>` gets a "read-only-storage" layout entry,
//   `var<storage, read_write>` a "storage" one, `var<uniform>` a "uniform" one;
// - a matmul kernel covers BM x BN of C per workgroup, attention BR query rows of one head.
// Plain ES module, no imports: the cells load it from a blob URL, so it works in JupyterLab,
// in the built book and on any static host.

const CONST = /^const (\w+): (\w+) = ([^;]+);/gm;
const BINDING = /@binding\((\d+)\)\s+var<(storage, read_write|storage, read|storage|uniform)>/g;
const LAYOUT = {"storage, read": "read-only-storage", "storage, read_write": "storage", storage: "read-only-storage",
                uniform: "uniform"};

export class WebGPUUnavailable extends Error {}

// The adapter and device, or a WebGPUUnavailable whose message says what is missing.
export async function getDevice({onLost} = {}) {
  if (!globalThis.navigator?.gpu) {
    throw new WebGPUUnavailable(
      "This browser has no WebGPU (navigator.gpu is undefined). Use a recent Chrome or Edge; " +
      "Firefox and Safari need WebGPU turned on. Pages must also be served over https or from localhost.");
  }
  const adapter = await navigator.gpu.requestAdapter({powerPreference: "high-performance"});
  if (!adapter) {
    throw new WebGPUUnavailable(
      "WebGPU is there, but the browser offered no GPU adapter (no usable GPU or driver, or GPU " +
      "acceleration is turned off). Chrome's chrome://gpu page says why.");
  }
  const wanted = ["shader-f16", "timestamp-query", "subgroups"].filter((f) => adapter.features.has(f));
  // WebGPU's default is 16 KB of workgroup memory; the double-buffered matmuls need 32, which most
  // adapters offer when asked: ask for what this one has
  const workgroupBytes = adapter.limits.maxComputeWorkgroupStorageSize;
  const device = await adapter.requestDevice({requiredFeatures: wanted,
                                              requiredLimits: {maxComputeWorkgroupStorageSize: workgroupBytes}});
  device.lost.then((info) => {
    if (info.reason !== "destroyed" && onLost) onLost(`The GPU device was lost (${info.message || info.reason}).`);
  });
  const info = adapter.info || {};
  const name = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ") || "unknown GPU";
  return {adapter, device, features: new Set(wanted), name, workgroupBytes,
          fallback: Boolean(adapter.isFallbackAdapter ?? info.isFallbackAdapter)};
}

// The kernel source with named `const` parameters replaced; unknown names are an error.
export function withParams(src, params = {}) {
  const known = [...src.matchAll(CONST)].map((m) => m[1]);
  const unknown = Object.keys(params).filter((k) => !known.includes(k));
  if (unknown.length) throw new Error(`no parameter ${unknown} in this kernel; its constants are ${known}`);
  return src.replace(CONST, (line, name, type) =>
    name in params ? `const ${name}: ${type} = ${Math.trunc(params[name])}${type === "u32" ? "u" : ""};` : line);
}

// Integer constants: literals, and names of earlier constants (`BM = TILE`).
export function constants(src) {
  const values = {};
  for (const [, name, , raw] of src.matchAll(CONST)) {
    const value = raw.trim().replace(/u$/, "");
    if (/^\d+$/.test(value)) values[name] = Number(value);
    else if (value in values) values[name] = values[value];
  }
  return values;
}

export function bindings(src) {
  return [...src.matchAll(BINDING)].map((m) => [Number(m[1]), LAYOUT[m[2]]]).sort((a, b) => a[0] - b[0]);
}

// The most private-array memory per invocation the book dispatches, as in webgpu.py: the naive
// kernel's rows at MAX_T = 2048, the largest that ran on an H200 (at 4096 its device was lost).
export const PRIVATE_BYTES_LIMIT = 8448;

export class TooMuchPrivateMemory extends Error {
  constructor(bytes) {
    super(`the naive kernel would keep ${bytes.toLocaleString("en")} bytes of private arrays per invocation; the book ` +
          `stops at ${PRIVATE_BYTES_LIMIT.toLocaleString("en")} (the most that ran on an H200; 16,640 lost its device). ` +
          "FlashAttention-2 keeps no score row and runs at any length");
  }
}

// Compile a kernel; WGSL errors (with line and column) and validation errors are thrown, never
// swallowed: a layout that disagreed with the shader would otherwise be a silent wrong answer.
export async function compile(gpu, src, label = "kernel") {
  for (const [enable, feature] of [["enable f16;", "shader-f16"], ["enable subgroups;", "subgroups"]]) {
    if (src.includes(enable) && !gpu.features.has(feature)) {
      throw new Error(`${label} needs the WebGPU feature ${feature}, which this GPU does not offer`);
    }
  }
  const consts = constants(src);
  // the naive kernel's private arrays, its score row (MAX_T floats) and output row (D floats), checked
  // before the driver sees the kernel: on an H200 even compiling it at MAX_T = 4096 lost the device
  const privateBytes = consts.MAX_T ? 4 * (consts.MAX_T + consts.D) : 0;
  if (privateBytes > PRIVATE_BYTES_LIMIT) throw new TooMuchPrivateMemory(privateBytes);
  const {device} = gpu;
  device.pushErrorScope("validation");
  const module = device.createShaderModule({code: src, label});
  const messages = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
  if (messages.length) {
    await device.popErrorScope();
    throw new Error(`${label}: ` + messages.map((m) => `line ${m.lineNum}:${m.linePos} ${m.message}`).join("; "));
  }
  const layout = device.createBindGroupLayout({
    entries: bindings(src).map(([binding, type]) => ({binding, visibility: GPUShaderStage.COMPUTE, buffer: {type}})),
  });
  const pipeline = device.createComputePipeline({
    layout: device.createPipelineLayout({bindGroupLayouts: [layout]}), compute: {module, entryPoint: "main"},
  });
  const error = await device.popErrorScope();
  if (error) throw new Error(`${label}: ${error.message}`);
  return {pipeline, layout, consts, f16: src.includes("enable f16;"), label};
}

function median(values) {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

// Run a compiled kernel: `inputs` are typed arrays, `outputs` byte lengths, `uniform` a
// Uint32Array. Returns the outputs as ArrayBuffers and, with repeat > 0, the median time of
// `repeat` runs after the first: GPU timestamps when offered, else wall clock to completion.
export async function run(gpu, kernel, {inputs, outputs, uniform, grid, repeat = 0}) {
  const {device} = gpu;
  const make = (size, usage) => device.createBuffer({size: Math.max(4, Math.ceil(size / 4) * 4), usage});
  const inBufs = inputs.map((a) => {
    const b = make(a.byteLength, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST);
    const bytes = new Uint8Array(Math.ceil(a.byteLength / 4) * 4);  // writes come in whole 4-byte words
    bytes.set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
    device.queue.writeBuffer(b, 0, bytes);
    return b;
  });
  const outBufs = outputs.map((n) => make(n, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC));
  const uni = make(uniform.byteLength, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
  device.queue.writeBuffer(uni, 0, uniform);
  const all = [...inBufs, ...outBufs, uni];
  const group = device.createBindGroup({
    layout: kernel.layout, entries: all.map((buffer, binding) => ({binding, resource: {buffer}})),
  });
  const limit = device.limits.maxComputeWorkgroupsPerDimension;
  if (Math.max(...grid) > limit) throw new Error(`a grid of ${grid} workgroups is over this GPU's limit of ${limit}`);
  const stamps = repeat && gpu.features.has("timestamp-query") ? {
    set: device.createQuerySet({type: "timestamp", count: 2}),
    resolve: device.createBuffer({size: 16, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC}),
    read: device.createBuffer({size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST}),
  } : null;
  const submit = (timed) => {
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass(timed && stamps ? {
      timestampWrites: {querySet: stamps.set, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1},
    } : {});
    pass.setPipeline(kernel.pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(...grid);
    pass.end();
    if (timed && stamps) {
      encoder.resolveQuerySet(stamps.set, 0, 2, stamps.resolve, 0);
      encoder.copyBufferToBuffer(stamps.resolve, 0, stamps.read, 0, 16);
    }
    device.queue.submit([encoder.finish()]);
  };
  submit(false);
  const results = [];
  for (let i = 0; i < outBufs.length; i++) results.push(await readBack(device, outBufs[i], outputs[i]));
  let timing = null;
  if (repeat) {
    const times = [];
    let method = stamps ? "timestamp-query" : "wall-clock";
    for (let r = 0; r < repeat; r++) {
      const t0 = performance.now();
      submit(true);
      await device.queue.onSubmittedWorkDone();
      if (stamps) {
        await stamps.read.mapAsync(GPUMapMode.READ);
        const [start, end] = new BigUint64Array(stamps.read.getMappedRange().slice(0));
        stamps.read.unmap();
        times.push(Number(end - start) / 1e6);
      } else {
        times.push(performance.now() - t0);
      }
    }
    if (stamps && !times.every((t) => t > 0)) {  // some implementations write zeros: use the clock
      method = "wall-clock";
      times.length = 0;
      for (let r = 0; r < repeat; r++) {
        const t0 = performance.now();
        submit(false);
        await device.queue.onSubmittedWorkDone();
        times.push(performance.now() - t0);
      }
    }
    timing = {ms: median(times), runs: repeat, method};
  }
  for (const b of all) b.destroy();
  return {outputs: results, timing};
}

async function readBack(device, buffer, size) {
  const staging = device.createBuffer({size: buffer.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  const encoder = device.createCommandEncoder();
  encoder.copyBufferToBuffer(buffer, 0, staging, 0, buffer.size);
  device.queue.submit([encoder.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const copy = staging.getMappedRange().slice(0, size);
  staging.unmap();
  staging.destroy();
  return copy;
}

// f32 -> IEEE half bits, round to nearest even (for the f16-weight kernels).
export function toHalfBits(values) {
  const out = new Uint16Array(values.length);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  for (let i = 0; i < values.length; i++) {
    f[0] = values[i];
    const x = u[0];
    const sign = (x >>> 16) & 0x8000;
    const exp = (x >>> 23) & 0xff;
    let mant = x & 0x7fffff;
    if (exp === 0xff) { out[i] = sign | 0x7c00 | (mant ? 0x200 : 0); continue; }
    let e = exp - 127 + 15;
    if (e >= 0x1f) { out[i] = sign | 0x7c00; continue; }
    if (e <= 0) {  // subnormal half (or zero)
      if (e < -10) { out[i] = sign; continue; }
      mant |= 0x800000;
      const shift = 14 - e;
      let half = mant >>> shift;
      const rest = mant & ((1 << shift) - 1);
      const mid = 1 << (shift - 1);
      if (rest > mid || (rest === mid && (half & 1))) half++;
      out[i] = sign | half;
      continue;
    }
    let half = (e << 10) | (mant >>> 13);
    const rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (half & 1))) half++;
    out[i] = sign | half;
  }
  return out;
}

export function fromHalfBits(h) {
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

// Sizes checked before a dispatch, in the reader's words: a kernel given arrays that disagree with
// its sizes would read past them or return a result that means nothing.
export function checkShapes(what, sizes, arrays) {
  for (const [name, value] of Object.entries(sizes)) {
    if (!Number.isInteger(value) || value < 1) throw new Error(`${what}: ${name} must be a whole number of at least 1, got ${value}`);
  }
  for (const [name, [array, length]] of Object.entries(arrays)) {
    if (array.length !== length) {
      throw new Error(`${what}: ${name} holds ${array.length} numbers where its shape needs ${length}`);
    }
  }
}

// C = A @ B (row-major Float32Arrays) with one of the matmul kernels; pads for ALIGN, converts
// B to f16 for the f16 kernels. Returns {c, timing}.
export async function matmul(gpu, kernel, a, b, m, n, k, repeat = 0) {
  checkShapes("matmul", {m, n, k}, {"A (m x k)": [a, m * k], "B (k x n)": [b, k * n]});
  const align = kernel.consts.ALIGN || 1;
  const kp = Math.ceil(k / align) * align;
  const np = Math.ceil(n / align) * align;
  const ap = pad2(a, m, k, m, kp);
  let bp = pad2(b, k, n, kp, np);
  if (kernel.f16) bp = toHalfBits(bp);
  const {outputs, timing} = await run(gpu, kernel, {
    inputs: [ap, bp], outputs: [m * np * 4], uniform: new Uint32Array([m, np, kp, 0]),
    grid: [Math.ceil(np / kernel.consts.BN), Math.ceil(m / kernel.consts.BM), 1], repeat,
  });
  const padded = new Float32Array(outputs[0]);
  return {c: np === n ? padded : unpad2(padded, m, np, n), timing};
}

// Causal attention of (H, T, D) Float32Arrays. Returns {o, lse, timing}.
export async function attention(gpu, kernel, q, k, v, h, t, d, repeat = 0) {
  // causal self-attention: keys and values are as long as the queries
  checkShapes("attention", {heads: h, length: t, "head size": d},
              {"q (H x T x D)": [q, h * t * d], "k (H x T x D)": [k, h * t * d], "v (H x T x D)": [v, h * t * d]});
  if (d !== kernel.consts.D) throw new Error(`this kernel is compiled for head size ${kernel.consts.D}, not ${d}`);
  if (kernel.consts.MAX_T && t > kernel.consts.MAX_T) {
    throw new Error(`the naive kernel keeps a private score row of MAX_T=${kernel.consts.MAX_T} floats; T=${t} is longer`);
  }
  const {outputs, timing} = await run(gpu, kernel, {
    inputs: [q, k, v], outputs: [h * t * d * 4, h * t * 4], uniform: new Uint32Array([h, t, 0, 0]),
    grid: [Math.ceil(t / kernel.consts.BR), h, 1], repeat,
  });
  return {o: new Float32Array(outputs[0]), lse: new Float32Array(outputs[1]), timing};
}

function pad2(x, rows, cols, prows, pcols) {
  if (rows === prows && cols === pcols) return x;
  const out = new Float32Array(prows * pcols);
  for (let r = 0; r < rows; r++) out.set(x.subarray(r * cols, (r + 1) * cols), r * pcols);
  return out;
}

function unpad2(x, rows, pcols, cols) {
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) out.set(x.subarray(r * pcols, r * pcols + cols), r * cols);
  return out;
}

// Deterministic inputs: a small linear congruential generator, uniform in [-1, 1).
export function randomArray(n, seed) {
  const out = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2 ** 31 - 1;
  }
  return out;
}

// The largest error of C against float64 dot products, on up to `samples` entries spread over C
// (all of them for small matrices), with B as the kernel stored it (`half` for f16 weights).
export function checkMatmul(c, a, b, m, n, k, {half = false, samples = 4096} = {}) {
  const weight = half ? (() => { const h = toHalfBits(b); return (i) => fromHalfBits(h[i]); })() : (i) => b[i];
  const total = m * n;
  const step = total <= samples ? 1 : total / samples;
  let worst = 0;
  for (let s = 0; s < Math.min(total, samples); s++) {
    const idx = Math.floor(s * step);
    const row = Math.floor(idx / n);
    const col = idx % n;
    let acc = 0;
    for (let i = 0; i < k; i++) acc += a[row * k + i] * weight(i * n + col);
    worst = Math.max(worst, Math.abs(acc - c[idx]));
  }
  return worst;
}

// Causal attention in float64 on the CPU, for rows `rows` of every head: the largest error of
// the kernel's output and logsumexp.
export function checkAttention(o, lse, q, k, v, h, t, d, rows) {
  let worst = 0;
  const scale = 1 / Math.sqrt(d);
  for (let head = 0; head < h; head++) {
    const base = head * t * d;
    for (const i of rows) {
      const s = new Float64Array(i + 1);
      let m = -Infinity;
      for (let j = 0; j <= i; j++) {
        let dot = 0;
        for (let x = 0; x < d; x++) dot += q[base + i * d + x] * k[base + j * d + x];
        s[j] = dot * scale;
        m = Math.max(m, s[j]);
      }
      let l = 0;
      const out = new Float64Array(d);
      for (let j = 0; j <= i; j++) {
        const p = Math.exp(s[j] - m);
        l += p;
        for (let x = 0; x < d; x++) out[x] += p * v[base + j * d + x];
      }
      for (let x = 0; x < d; x++) worst = Math.max(worst, Math.abs(out[x] / l - o[base + i * d + x]));
      worst = Math.max(worst, Math.abs(m + Math.log(l) - lse[head * t + i]));
    }
  }
  return worst;
}
