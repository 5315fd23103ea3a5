// The book's browser cells: the matmul race (module 3) and naive vs FlashAttention-2 (module 7),
// run on the reader's GPU with runtime.js and checked against the CPU in the page.
// mount(root, runtime, files, config) is called by the cell's HTML (posttrainllm.webgpu.browser_cell),
// which passes the runtime module and the kernel sources. When the run ends, root.dataset.state
// is "done" (or "stopped", when the reader pressed Stop) and root.dataset.results holds every
// measurement as JSON (the browser tests read it).

const SIZES = {
  matmul: {small: [64, 128, 256], standard: [256, 512, 1024], large: [1024, 2048]},
  attention: {small: [64, 128, 256], standard: [256, 512, 1024], large: [1024, 2048, 4096]},
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

export async function mount(root, rt, files, config) {
  root.replaceChildren();
  const status = el("p", {class: "ptl-status"}, "Looking for a WebGPU adapter...");
  const sizes = el("select", {class: "ptl-sizes", "aria-label": "sizes"});
  for (const [name, list] of Object.entries(SIZES[config.kind])) {
    sizes.append(el("option", {value: name}, `${name}: ${list.join(", ")}`));
  }
  const button = el("button", {class: "ptl-run", type: "button", disabled: ""},
                    config.kind === "matmul" ? "Run the matmul race" : "Run naive vs FlashAttention-2");
  const stop = el("button", {class: "ptl-stop", type: "button", disabled: ""}, "Stop");
  // wide tables scroll inside the cell instead of running past the page's column
  const output = el("div", {class: "ptl-output", style: "overflow-x:auto;max-width:100%"});
  root.append(el("div", {class: "ptl-controls"}, sizes, " ", button, " ", stop), status, output);
  root.dataset.state = "starting";
  let gpu;
  try {
    gpu = await rt.getDevice({onLost: (message) => fail(root, status, message)});
  } catch (err) {
    status.textContent = err.message;
    status.classList.add("ptl-unavailable");
    root.dataset.state = err instanceof rt.WebGPUUnavailable ? "unavailable" : "error";
    return;
  }
  const kinds = [...gpu.features].join(", ") || "none";
  status.textContent = `Ready: ${gpu.name}${gpu.fallback ? " — a software (CPU) adapter: its times say nothing " +
    "about GPU speed" : ""}. Optional features: ${kinds}.`;
  // a software adapter takes minutes over the standard sizes: start it on the small ones
  sizes.value = gpu.fallback ? "small" : "standard";
  root.dataset.state = "ready";
  button.disabled = false;
  let run = null;
  stop.addEventListener("click", () => {
    if (run) run.stopped = true;
    stop.disabled = true;
    status.textContent = "Stopping after the kernel that is running now...";
  });
  button.addEventListener("click", async () => {
    button.disabled = true;
    stop.disabled = false;
    root.dataset.state = "running";
    run = {stopped: false, results: []};
    try {
      const list = SIZES[config.kind][sizes.value];
      const compiled = compiler(rt, gpu, files);
      if (config.kind === "matmul") await matmulRace(rt, compiled, gpu, config.variants, list, output, status, run);
      else await attentionRace(rt, compiled, gpu, config.variants, list, output, status, run);
      root.dataset.state = "done";
    } catch (err) {
      if (err instanceof Stopped) {
        status.textContent = `Stopped by you after ${run.results.length} measurements; choose smaller sizes or run again.`;
        root.dataset.state = "stopped";
      } else {
        fail(root, status, err.message);
      }
    }
    root.dataset.results = JSON.stringify(run.results);
    button.disabled = false;
    stop.disabled = true;
  });
}

class Stopped extends Error {}

// A kernel's pipeline, compiled once per run and reused at every size: the sizes reach a kernel as
// uniforms, not in its source. A software adapter (SwiftShader) spends seconds compiling a variant
// and milliseconds running it at the small sizes, so compiling per size tripled a run.
function compiler(rt, gpu, files) {
  const pipelines = new Map();
  return (file, params, label) => {
    const key = `${file} ${JSON.stringify(params)}`;
    if (!pipelines.has(key)) pipelines.set(key, rt.compile(gpu, rt.withParams(files[file], params), label));
    return pipelines.get(key);  // a promise: a failed compile fails again, the same way, at every size
  };
}

// Why this GPU cannot run a kernel variant (an optional feature, or more workgroup memory than it
// has; the cell's config carries each variant's need, read from its source), or null.
function missing(gpu, variant) {
  if (variant.feature && !gpu.features.has(variant.feature)) return `needs ${variant.feature}, which this GPU lacks`;
  if (variant.workgroup_bytes > gpu.workgroupBytes) {
    return `needs ${variant.workgroup_bytes.toLocaleString("en")} bytes of workgroup memory; this GPU offers ` +
      gpu.workgroupBytes.toLocaleString("en");
  }
  return null;
}

// Called between kernels: a kernel already on the GPU cannot be interrupted, so Stop takes effect
// when it returns.
function checkpoint(run) {
  if (run.stopped) throw new Stopped("stopped");
}

function fail(root, status, message) {
  status.textContent = `Stopped: ${message}`;
  status.classList.add("ptl-unavailable");
  root.dataset.state = "error";
}

const PAD = "padding:2px 12px;text-align:left;white-space:nowrap";

function table(columns) {
  const body = el("tbody");
  const head = el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", {style: PAD}, c))));
  const t = el("table", {class: "ptl-table", style: "border-collapse:collapse;margin:0.5em 0"}, head, body);
  const cell = (c) => el("td", {style: PAD}, c instanceof Node ? c : String(c));
  return {t, add: (...cells) => body.append(el("tr", {}, ...cells.map(cell)))};
}

function bar(fraction) {
  return el("div", {class: "ptl-bar", style: `width:${Math.max(1, 100 * fraction)}px;height:10px;background:#4a7ab5`});
}

// Each race adds its measurements to run.results as they come, so a Stop keeps what was measured.
async function matmulRace(rt, compiled, gpu, variants, list, output, status, run) {
  const results = run.results;
  const {t, add} = table(["n", "kernel", "GFLOP/s", "check", "max error", ""]);
  output.replaceChildren(t);
  for (const n of list) {
    const a = rt.randomArray(n * n, n);
    const b = rt.randomArray(n * n, n + 1);
    const rows = [];
    for (const v of variants) {
      checkpoint(run);
      status.textContent = `n = ${n}: ${v.name}...`;
      const lacking = missing(gpu, v);
      if (lacking) {
        rows.push({n, kernel: v.name, skipped: lacking});
        continue;
      }
      const kernel = await compiled(v.file, v.params, v.name);
      const {c, timing} = await rt.matmul(gpu, kernel, a, b, n, n, n, 3);
      const error = rt.checkMatmul(c, a, b, n, n, n, {half: kernel.f16});
      rows.push({n, kernel: v.name, gflops: (2 * n ** 3) / timing.ms / 1e6, ms: timing.ms, method: timing.method,
                 error, ok: error <= 1e-5 * n});
    }
    const best = Math.max(...rows.filter((r) => r.gflops).map((r) => r.gflops));
    for (const r of rows) {
      if (r.skipped) add(n, r.kernel, "-", r.skipped, "-", "");
      else add(n, r.kernel, r.gflops.toFixed(1), r.ok ? "✓ matches the CPU" : "✗ WRONG", r.error.toExponential(1), bar(r.gflops / best));
    }
    results.push(...rows);
  }
  const timed = results.filter((r) => r.gflops);
  const largest = Math.max(...timed.map((r) => r.n));
  const top = timed.filter((r) => r.n === largest).sort((x, y) => y.gflops - x.gflops)[0];
  const naive = timed.find((r) => r.n === largest && r.kernel === "naive");
  status.textContent = `Done. At n = ${largest} the fastest kernel here is "${top.kernel}", ${top.gflops.toFixed(1)} ` +
    `GFLOP/s, ${(top.gflops / naive.gflops).toFixed(1)}x the naive kernel (${top.method}). ` +
    (timed.every((r) => r.ok) ? "Every result matched the CPU." : "Some results did NOT match the CPU.");
}

async function attentionRace(rt, compiled, gpu, variants, list, output, status, run) {
  const h = 4;
  const d = 64;
  const results = run.results;
  const {t, add} = table(["T", "kernel", "ms", "max error", "check"]);
  const plot = el("div", {class: "ptl-plot"});
  output.replaceChildren(t, plot);
  for (const len of list) {
    const [q, k, v] = [1, 2, 3].map((s) => rt.randomArray(h * len * d, len * 10 + s));
    const rows = [0, 1, Math.floor(len / 2), len - 1].filter((r, i, all) => r < len && all.indexOf(r) === i);
    for (const variant of variants) {
      checkpoint(run);
      status.textContent = `T = ${len}: ${variant.name}...`;
      const lacking = missing(gpu, variant);
      if (lacking) {
        results.push({t: len, kernel: variant.name, skipped: lacking});
        add(len, variant.name, "-", "-", `not run: ${lacking}`);
        continue;
      }
      const params = {...variant.params};
      if (variant.file.includes("naive")) params.MAX_T = Math.max(1024, len);  // the private row must hold T scores
      let measured;
      try {
        const kernel = await compiled(variant.file, params, variant.name);
        measured = await rt.attention(gpu, kernel, q, k, v, h, len, d, 3);
      } catch (err) {
        if (!(err instanceof rt.TooMuchPrivateMemory)) throw err;
        results.push({t: len, kernel: variant.name, skipped: err.message});  // refused before the driver saw it
        add(len, variant.name, "-", "-", `not run: ${err.message}`);
        continue;
      }
      const {o, lse, timing} = measured;
      const error = rt.checkAttention(o, lse, q, k, v, h, len, d, rows);
      results.push({t: len, kernel: variant.name, ms: timing.ms, method: timing.method, error, ok: error < 1e-4});
      add(len, variant.name, timing.ms.toFixed(3), error.toExponential(1), error < 1e-4 ? "✓ matches the CPU" : "✗ WRONG");
    }
  }
  const timed = results.filter((r) => !r.skipped);
  plot.append(linePlot(timed));
  const longest = Math.max(...list);
  const flash = timed.filter((r) => r.t === longest && r.kernel !== "naive").sort((x, y) => x.ms - y.ms)[0];
  const naive = timed.find((r) => r.t === longest && r.kernel === "naive");
  const ratio = naive ? naive.ms / flash.ms : null;
  status.textContent = `Done. At T = ${longest}, the fastest FlashAttention-2 ("${flash.kernel}") takes ` +
    `${flash.ms.toFixed(2)} ms; ` + (naive ? `the naive kernel ${naive.ms.toFixed(2)} ms, so FlashAttention-2 is ` +
    (ratio >= 1 ? `${ratio.toFixed(1)}x faster` : `${(1 / ratio).toFixed(1)}x slower`) + " here. "
      : "the naive kernel was not run: its private score row would be too large. ") +
    (timed.every((r) => r.ok) ? "Every result matched the CPU." : "Some results did NOT match the CPU.");
}

// Time against context length, one line per kernel, log-log, as inline SVG.
function linePlot(results) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const [w, h, pad] = [360, 200, 36];
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  const ts = [...new Set(results.map((r) => r.t))];
  const lx = (t) => pad + (w - 2 * pad) * (ts.length > 1 ? Math.log(t / ts[0]) / Math.log(ts.at(-1) / ts[0]) : 0.5);
  const ms = results.map((r) => Math.log(r.ms));
  const [lo, hi] = [Math.min(...ms), Math.max(...ms) + 1e-9];
  const ly = (m) => h - pad - (h - 2 * pad) * ((Math.log(m) - lo) / (hi - lo));
  const colours = ["#c0504d", "#4a7ab5", "#5b9c4a"];
  [...new Set(results.map((r) => r.kernel))].forEach((name, i) => {
    const pts = results.filter((r) => r.kernel === name).map((r) => `${lx(r.t)},${ly(r.ms)}`).join(" ");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colours[i % colours.length]);
    line.setAttribute("stroke-width", "2");
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", pad + 4);
    label.setAttribute("y", 14 + 14 * i);
    label.setAttribute("fill", colours[i % colours.length]);
    label.setAttribute("font-size", "12");
    label.textContent = name;
    svg.append(line, label);
  });
  const axis = document.createElementNS(ns, "text");
  axis.setAttribute("x", w / 2 - 60);
  axis.setAttribute("y", h - 8);
  axis.setAttribute("font-size", "11");
  axis.textContent = `context ${ts[0]} to ${ts.at(-1)} (log), ms (log)`;
  svg.append(axis);
  return svg;
}
