// The browser cell of module 7: train the tiny GPT in the reader's browser with the WASM trainer.
// mount(root, files, config) is called by the cell's HTML (posttrainllm.wasm.browser_cell), which
// passes the JavaScript and the builds inline. Training runs in a Web Worker (wasm/worker.js) on
// the fastest build the browser runs (pickBuild): relaxed SIMD where its engine has it, threads
// where the page is cross-origin isolated (otherwise one thread, and a note saying why). When it
// ends, root.dataset.state is "done" and root.dataset.results holds the run as JSON (the browser
// tests read it).

const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function bytes(base64) {
  return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
}

function blobUrl(text, type = "text/javascript") {
  return URL.createObjectURL(new Blob([text], {type}));
}

// Where the book's root is, from Sphinx's <html data-content_root>; null outside the book.
function siteRoot() {
  const root = document.documentElement.dataset.content_root;
  return root === undefined ? null : new URL(root, location.href);
}

function isolationNote(root, status) {
  if (self.crossOriginIsolated) return null;
  const note = el("p", {class: "ptl-threads-note"},
    "This page is not cross-origin isolated, so the browser withholds SharedArrayBuffer, and " +
    "WebAssembly threads need it to share memory: training runs on one thread. ");
  const base = siteRoot();
  if (base && "serviceWorker" in navigator && self.isSecureContext) {
    const button = el("button", {class: "ptl-isolate", type: "button"}, "Turn on threads");
    button.addEventListener("click", async () => {
      button.disabled = true;
      status.textContent = "Installing the book's service worker (coi-sw.js), then reloading...";
      try {
        await navigator.serviceWorker.register(new URL("coi-sw.js", base), {scope: base.pathname});
        await navigator.serviceWorker.ready;
        location.reload();
      } catch (err) {
        status.textContent = `The service worker could not be installed: ${err.message}`;
      }
    });
    note.append("Its host sends no isolation headers; the button installs a small service worker " +
                "that adds them to every page of this book, and reloads this one. ", button);
  } else {
    note.append("Outside the book (in JupyterLab, say) the server must send the headers " +
                "Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp.");
  }
  return note;
}

function lossPlot(steps, oracle) {
  const [w, h, pad] = [420, 200, 34];
  const top = 7;
  const x = (s) => pad + ((w - 2 * pad) * s) / steps;
  const y = (loss) => h - pad - ((h - 2 * pad) * Math.min(loss, top)) / top;
  const plot = svg("svg", {width: w, height: h, class: "ptl-loss-plot"});
  plot.append(svg("line", {x1: pad, y1: h - pad, x2: w - pad, y2: h - pad, stroke: "#888"}),
              svg("line", {x1: pad, y1: pad, x2: pad, y2: h - pad, stroke: "#888"}));
  for (const [label, lx, ly] of [[`step ${steps}`, w - pad - 50, h - 10], ["loss", 4, pad - 8], ["0", pad - 14, h - pad]]) {
    const t = svg("text", {x: lx, y: ly, "font-size": 11});
    t.textContent = label;
    plot.append(t);
  }
  oracle.slice(0, steps).forEach((loss, i) => plot.append(svg("circle", {cx: x(i + 1), cy: y(loss), r: 2.5, fill: "#c0504d"})));
  const line = svg("polyline", {fill: "none", stroke: "#4a7ab5", "stroke-width": 2, points: ""});
  plot.append(line);
  return {plot, add: (step, loss) => line.setAttribute("points", `${line.getAttribute("points")} ${x(step)},${y(loss)}`)};
}

// the scripts the threaded builds start their workers from: Emscripten's and freestanding_loader.mjs's
const WORKER_FILES = ["tinygpt-threads.worker.js", "freestanding_worker.mjs"];

const BUILD_NAMES = {
  "relaxed-threads": "the threaded relaxed-SIMD build (fused multiply-add)",
  threads: "the threaded SIMD build",
  relaxed: "the single-thread relaxed-SIMD build (fused multiply-add)",
  simd: "the single-thread SIMD build",
};

// The fastest build this engine runs, or null: relaxed SIMD (a fused multiply-add in the matmul)
// before plain SIMD, and threads only on an isolated page, where SharedArrayBuffer exists.
export function pickBuild(files, isolated) {
  const order = isolated ? ["relaxed-threads", "threads", "relaxed", "simd"] : ["relaxed", "simd"];
  return order.find((build) => WebAssembly.validate(bytes(files[`tinygpt-${build}.wasm`]))) ?? null;
}

export function mount(root, files, config) {
  root.replaceChildren();
  const status = el("p", {class: "ptl-status"});
  const isolated = Boolean(self.crossOriginIsolated);
  const threads = isolated ? Math.max(1, Math.min(navigator.hardwareConcurrency || 2, 8)) : 1;
  const steps = el("select", {class: "ptl-steps", "aria-label": "steps"});
  for (const n of config.stepChoices) {
    const option = el("option", {value: n}, `${n} steps`);
    if (n === config.defaultSteps) option.selected = true;
    steps.append(option);
  }
  const train = el("button", {class: "ptl-train", type: "button"}, "Train in your browser");
  const stop = el("button", {class: "ptl-stop", type: "button", disabled: ""}, "Stop");
  const stats = el("p", {class: "ptl-stats"});
  const chart = el("div", {class: "ptl-chart"});
  const sample = el("pre", {class: "ptl-sample", style: "white-space:pre-wrap"});
  const note = isolationNote(root, status);
  root.append(el("div", {class: "ptl-controls"}, steps, " ", train, " ", stop), status, ...(note ? [note] : []),
              stats, chart, sample);
  const build = typeof WebAssembly === "object" ? pickBuild(files, isolated) : null;
  if (!("Worker" in self) || !build) {
    status.textContent = "This browser cannot run the trainer: it needs Web Workers and WebAssembly with SIMD.";
    root.dataset.state = "unavailable";
    train.disabled = true;
    return;
  }
  const c = config.model;
  status.textContent = `Ready: a ${c.layers}-layer GPT of width ${c.embd} (the oracle's shape), ` +
    `${BUILD_NAMES[build]}${build.endsWith("threads") ? ` on ${threads} threads` : ""}.`;
  root.dataset.state = "ready";
  const vocab = config.vocab.map(bytes);
  const decode = (ids) => new TextDecoder().decode(Uint8Array.from(ids.flatMap((i) => [...vocab[i]])));

  train.addEventListener("click", () => {
    const total = Number(steps.value);
    const worker = new Worker(blobUrl(files["worker.js"]), {type: "module"});
    const {plot, add} = lossPlot(total, config.oracle);
    chart.replaceChildren(plot);
    sample.textContent = "";
    const run = {build, isolated, threads: null, losses: [], tokensPerSecond: null};
    train.disabled = steps.disabled = true;
    stop.disabled = false;
    root.dataset.state = "training";
    status.textContent = "Loading the trainer...";
    const finish = (state, message) => {
      worker.terminate();
      train.disabled = steps.disabled = false;
      stop.disabled = true;
      status.textContent = message;
      root.dataset.results = JSON.stringify(run);
      root.dataset.state = state;
    };
    stop.onclick = () => {
      stop.disabled = true;
      worker.postMessage({cmd: "stop"});
    };
    worker.onerror = (event) => finish("error", `The trainer stopped: ${event.message}`);
    worker.onmessage = ({data}) => {
      if (data.kind === "ready") {
        run.threads = data.threads;
        status.textContent = `Training ${data.nParams.toLocaleString()} parameters on ${data.threads} ` +
          `thread${data.threads > 1 ? "s" : ""}; red dots: the PyTorch oracle's losses on the same batches.`;
      } else if (data.kind === "step") {
        run.losses.push(data.loss);
        run.tokensPerSecond = data.tokensPerSecond;
        add(data.step, data.loss);
        stats.textContent = `step ${data.step} / ${total} · loss ${data.loss.toFixed(3)} · ` +
          `${Math.round(data.tokensPerSecond).toLocaleString()} tokens/s · ${run.threads} thread(s)`;
      } else if (data.kind === "done") {
        const compared = Math.min(run.losses.length, config.oracle.length);
        run.drift = Math.max(0, ...run.losses.slice(0, compared).map((l, i) => Math.abs(l - config.oracle[i])));
        run.sample = decode(data.sample);
        sample.textContent = run.sample;
        finish("done", `${data.stopped ? "Stopped" : "Done"} after ${run.losses.length} steps: loss ` +
          `${run.losses[0].toFixed(3)} to ${run.losses.at(-1).toFixed(3)}. Over the first ${compared} steps the ` +
          `largest difference from the PyTorch oracle is ${run.drift.toExponential(1)}. Below: a sample ` +
          `(temperature 0.8) from the model you just trained.`);
      } else if (data.kind === "error") {
        finish("error", `The trainer stopped: ${data.message}`);
      }
    };
    const file = `tinygpt-${build}`;
    worker.postMessage({
      cmd: "train",
      urls: {trainer: blobUrl(files["trainer.mjs"]), build: blobUrl(files[`${file}.mjs`]),
             workers: Object.fromEntries(WORKER_FILES.map((name) => [name, blobUrl(files[name])]))},
      wasm: bytes(files[`${file}.wasm`]).buffer, threads, config: c,
      tokens: new Uint16Array(bytes(config.tokens).buffer), seed: config.seed, lr: config.lr, steps: total,
      prompt: config.prompt, sampleLength: config.sampleLength,
    });
  });
}
