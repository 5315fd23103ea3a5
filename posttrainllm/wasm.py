"""Module 7's tiny-GPT trainer in WebAssembly (``posttrainllm/assets/wasm/``), driven and checked from Python.

``posttrainllm/assets/wasm/tinygpt.cpp`` trains the oracle GPT (:mod:`posttrainllm.model`, default architecture) in
C++ compiled six ways — plain scalar code, 128-bit SIMD and SIMD with threads (Emscripten, run
under node and in the browser), relaxed SIMD with fused multiply-add, alone and with threads (zig,
node and the browser), and Memory64 (zig, run in wasmtime) — and this module is its Python side:

- the trainer's own initialisation and batch sampler, reproduced in numpy, so that the PyTorch
  oracle can start from the same weights and see the same batches (:func:`init_weights`,
  :func:`batch_starts`);
- the weights file the trainer reads (:func:`weights_bytes`) and the mapping between its flat
  parameter array and the oracle's ``state_dict`` (:func:`flat_params`, :func:`load_flat`);
- :func:`run`, which runs a build (under node, or the Memory64 one in wasmtime), and
  :func:`oracle_losses`, the same training in PyTorch; the loss drift between the two is this
  port's correctness number;
- :func:`browser_cell`, which trains it in the reader's browser.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from posttrainllm import assets

WASM = assets.folder("wasm")
DIST = WASM / "dist"
BUILDS = ("scalar", "simd", "threads", "relaxed", "relaxed-threads", "memory64")
MEMORY64_LIMIT = 1 << 30  # bytes the Memory64 build may grow to here (it has no fixed ceiling)
MAGIC = b"PTLGPT1\0"
BATCH = 16  # module 7's batch size, and the trainer's
GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def trainer_config(config, batch: int = BATCH) -> dict:
    """The trainer's shape from a :class:`~posttrainllm.model.GPTConfig` (which must use the
    default architecture: the only one the C++ implements)."""
    wanted = {"norm": "layernorm", "mlp": "gelu", "positions": "learned", "tie_weights": True, "n_kv_head": None,
              "window": None}
    other = {k: getattr(config, k) for k, v in wanted.items() if getattr(config, k) != v}
    if other:
        raise ValueError(f"the WASM trainer implements the default GPT only; this config differs in {other}")
    return {"vocab": config.vocab_size, "block": config.block_size, "layers": config.n_layer,
            "heads": config.n_head, "embd": config.n_embd, "batch": batch}


def splitmix64(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Draws ``start .. start+count-1`` of the trainer's generator (``Rng`` in tinygpt.cpp): the
    k-th is a fixed mix of ``seed + (k+1) * GOLDEN``, so any draw can be computed directly."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(start + 1, start + count + 1, dtype=np.uint64) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def shapes(config) -> list[tuple[str, tuple[int, ...]]]:
    """The trainer's parameters in order: the oracle's ``state_dict`` without the tied head."""
    c, out = config, [("tok_emb.weight", (config.vocab_size, config.n_embd)),
                      ("pos_emb.weight", (config.block_size, config.n_embd))]
    d = c.n_embd
    for i in range(c.n_layer):
        for name, shape in [("norm1.weight", (d,)), ("norm1.bias", (d,)), ("attn.qkv.weight", (3 * d, d)),
                            ("attn.qkv.bias", (3 * d,)), ("attn.proj.weight", (d, d)), ("attn.proj.bias", (d,)),
                            ("norm2.weight", (d,)), ("norm2.bias", (d,)), ("mlp.up.weight", (4 * d, d)),
                            ("mlp.up.bias", (4 * d,)), ("mlp.proj.weight", (d, 4 * d)), ("mlp.proj.bias", (d,))]:
            out.append((f"blocks.{i}.{name}", shape))
    return [*out, ("norm.weight", (d,)), ("norm.bias", (d,))]


def init_weights(config, seed: int = 0) -> np.ndarray:
    """The trainer's initial parameters (``tg_create``), flat float32: the oracle's scheme —
    N(0, 0.02) matrices, residual projections scaled by 1/sqrt(2 n_layer), zero biases, unit
    gains — drawn by Box-Muller from splitmix64 instead of torch's generator."""
    parts, drawn = [], 0
    for name, shape in shapes(config):
        size = int(np.prod(shape))
        if len(shape) == 1:
            parts.append(np.full(size, 1.0 if name.endswith("weight") else 0.0, dtype=np.float32))
            continue
        std = 0.02 / np.sqrt(2 * config.n_layer) if name.endswith("proj.weight") else 0.02
        draws = (splitmix64(seed, 2 * size, drawn) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        drawn += 2 * size
        u1, u2 = 1.0 - draws[0::2], draws[1::2]
        parts.append((std * np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)).astype(np.float32))
    return np.concatenate(parts)


def flat_params(model) -> np.ndarray:
    """The oracle's parameters in the trainer's order, flat float32."""
    state = model.state_dict()
    return np.concatenate([state[name].detach().float().numpy().ravel() for name, _ in shapes(model.config)])


def load_flat(model, flat: np.ndarray) -> None:
    """Copy a flat parameter array (the trainer's order) into the oracle, in place."""
    import torch

    state, offset = {}, 0
    for name, shape in shapes(model.config):
        size = int(np.prod(shape))
        state[name] = torch.from_numpy(np.asarray(flat[offset : offset + size], dtype=np.float32).reshape(shape))
        offset += size
    if offset != len(flat):
        raise ValueError(f"{len(flat):,} values for a model of {offset:,} parameters")
    model.load_state_dict({**model.state_dict(), **state})  # the tied head follows tok_emb


def weights_bytes(model) -> bytes:
    """The oracle's weights as the trainer reads them (``tg_load``): ``PTLGPT1\\0``, six int32
    (vocab, block, layers, heads, width, parameter count), then float32 little-endian."""
    c, flat = model.config, flat_params(model)
    return MAGIC + struct.pack("<6i", c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd, len(flat)) + \
        flat.astype("<f4").tobytes()


def batch_starts(seed: int, n_tokens: int, block: int, batch: int, steps: int) -> np.ndarray:
    """Where each sequence of each step's batch starts (steps x batch), as the trainer draws them."""
    return (splitmix64(seed, steps * batch) % np.uint64(n_tokens - block)).astype(np.int64).reshape(steps, batch)


def oracle_at_init(config, seed: int = 0, **changes):
    """The PyTorch oracle holding the trainer's initialisation from ``seed`` — where both sides
    of a drift measurement start. ``changes`` alter the oracle's config (``attention="flash"``)."""
    from dataclasses import replace

    from posttrainllm.model import GPT

    model = GPT(replace(config, **changes))
    load_flat(model, init_weights(config, seed=seed))
    return model


def oracle_losses(model, ids, steps: int, batch: int, seed: int = 0, lr: float = 3e-3) -> list[float]:
    """Train the PyTorch oracle in place for ``steps`` AdamW steps on the trainer's batches of
    ``ids``; the losses, one per step. The same function as :func:`posttrainllm.train.train`,
    with the batches drawn by the trainer's sampler instead of torch's."""
    import torch

    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    block = model.config.block_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for starts in batch_starts(seed, len(ids), block, batch, steps):
        x = torch.stack([ids[s : s + block] for s in starts])
        y = torch.stack([ids[s + 1 : s + 1 + block] for s in starts])
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def node() -> str:
    path = shutil.which("node")
    if path is None:
        raise RuntimeError("the WASM trainer runs under node here, and node is not installed (apt-get install nodejs)")
    return path


@functools.cache
def node_command() -> tuple[str, ...]:
    """node and its flags: relaxed SIMD is behind a flag in node 20 (V8 11.3) and on by default
    from V8 11.4, whose node may no longer accept the flag."""
    flags = subprocess.run([node(), "--v8-options"], capture_output=True, text=True, check=True).stdout
    relaxed = ("--experimental-wasm-relaxed-simd",) if "--experimental-wasm-relaxed-simd" in flags else ()
    return (node(), "--no-experimental-fetch", *relaxed)


def _ids(name: str, ids, vocab: int, shape: tuple[int, ...] | None = None) -> None:
    """Token ids as the trainer needs them: whole numbers in ``[0, vocab)`` (and of ``shape``)."""
    array = np.asarray(ids)
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (batch, block), got {array.shape}")
    if array.dtype.kind not in "iu":
        if array.dtype.kind != "f":
            raise ValueError(f"{name} must be whole token ids, got an array of {array.dtype}")
        whole = np.isfinite(array) & (array == np.round(array))
        if not whole.all():
            raise ValueError(f"{name} must be whole token ids; {array.flat[np.flatnonzero(~whole)[0]].item()!r} is not")
    outside = np.flatnonzero((array < 0) | (array >= vocab))
    if outside.size:
        i = int(outside[0])
        raise ValueError(f"{name}[{i}] is id {array.flat[i]}, outside the vocabulary of {vocab}")


def check_job(config: dict, *, threads: int, seed: int, tokens, steps: int, lr: float, batch) -> None:
    """Every id and hyperparameter of a run, checked before the trainer sees it (the trainer checks
    them again): a ``ValueError`` naming the bad value."""
    for name, value, low in (("threads", threads, 1), ("steps", steps, 0), ("seed", seed, 0)):
        if not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{name} must be a whole number of at least {low}, got {value!r}")
    if seed >= 1 << 32:
        raise ValueError(f"seed must be below 2**32, got {seed}")
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr >= 0):
        raise ValueError(f"the learning rate must be a finite number of 0 or more, got {lr!r}")
    if tokens is not None:
        _ids("tokens", tokens, config["vocab"])
    if batch is not None:
        for name, ids in zip(("inputs", "targets"), batch, strict=True):
            _ids(name, ids, config["vocab"], (config["batch"], config["block"]))


def _exact(ids, dtype: str, name: str) -> np.ndarray:
    """``ids`` in the trainer's file type, refused rather than wrapped when one does not fit (id
    2**32 + 5 would reach the trainer as 5, inside the vocabulary, past every later check)."""
    values = np.asarray(ids)
    limits = np.iinfo(np.dtype(dtype))
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name} must be whole-number token ids, got {values.dtype}")
    if values.size and (values.min() < limits.min or values.max() > limits.max):
        bad = values.max() if values.max() > limits.max else values.min()
        raise ValueError(f"{name} holds id {bad}, which the trainer's {limits.bits}-bit ids cannot hold")
    return values.astype(dtype)


def run(build: str, config: dict, *, threads: int = 1, seed: int = 0, weights: bytes | None = None,
        tokens=None, token_seed: int = 0, steps: int = 0, lr: float = 3e-3, batch=None,
        bench_gemm: tuple[list[int], int] | None = None, dist: Path = DIST, validate: bool = True,
        node_flags: tuple[str, ...] = ()) -> dict:
    """Run ``build`` of the trainer: Emscripten's under node (``posttrainllm/assets/wasm/node_run.mjs``), the
    Memory64 one in wasmtime (:class:`Memory64`), which node 20 cannot load. Returns its answer:
    ``losses`` of ``steps`` training steps on ``tokens``, ``seconds``, ``threads``, and with
    ``batch=(inputs, targets)`` that batch's ``loss``, ``grads`` and ``logits``; with
    ``bench_gemm=(sizes, reps)``, ``gemm``: seconds per n x n x n product and its largest error;
    ``params`` after training. ``node_flags`` go to node (a profiler's, say). A bad id or hyperparameter
    raises ``ValueError`` (:func:`check_job`; ``validate=False`` leaves the checking to the trainer, as
    the tests of its own checks need); a trainer error raises ``RuntimeError`` with the trainer's message."""
    if build not in BUILDS:
        raise ValueError(f"no build {build!r}; the builds are {BUILDS}")
    if validate:
        check_job(config, threads=threads, seed=seed, tokens=tokens, steps=steps, lr=lr, batch=batch)
    if build == "memory64":
        if threads != 1:
            raise ValueError("the Memory64 build has one thread")
        return Memory64(dist / "tinygpt64.wasm").run(config, seed, weights, tokens, token_seed, steps, lr, batch,
                                                     bench_gemm)
    with tempfile.TemporaryDirectory(prefix="tinygpt-") as tmp:
        tmp = Path(tmp)
        job = {"build": build, "dist": str(dist), "config": config, "threads": threads, "seed": seed,
               "adamw": {"lr": lr}, "steps": steps, "token_seed": token_seed, "out": str(tmp)}
        if bench_gemm is not None:
            job["bench_gemm"] = {"sizes": list(bench_gemm[0]), "reps": bench_gemm[1]}
        if weights is not None:
            (tmp / "weights.bin").write_bytes(weights)
            job["weights"] = str(tmp / "weights.bin")
        if tokens is not None:
            _exact(tokens, "<u2", "tokens").tofile(tmp / "tokens.u16")
            job["tokens"] = str(tmp / "tokens.u16")
        if batch is not None:
            for name, array in zip(("inputs", "targets"), batch, strict=True):
                _exact(array, "<i4", name).tofile(tmp / f"{name}.i32")
            job["batch"] = {name: str(tmp / f"{name}.i32") for name in ("inputs", "targets")}
        (tmp / "job.json").write_text(json.dumps(job, allow_nan=False))  # node's JSON has no NaN
        done = subprocess.run([*node_command(), *node_flags, str(WASM / "node_run.mjs"), str(tmp / "job.json")],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not done.stdout:
            raise RuntimeError(f"node failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        answer = json.loads(done.stdout)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        for name in ("params", "grads", "logits"):
            if (tmp / f"{name}.f32").is_file():
                answer[name] = np.fromfile(tmp / f"{name}.f32", dtype="<f4")
    return answer


class Memory64:
    """``tinygpt64.wasm`` in wasmtime: the same C API as the node builds, called from Python,
    with pointers 64 bits wide. Memory grows on demand up to :data:`MEMORY64_LIMIT`."""

    def __init__(self, path: Path) -> None:
        import wasmtime

        config = wasmtime.Config()
        config.wasm_memory64 = True
        engine = wasmtime.Engine(config)
        self.store = wasmtime.Store(engine)
        self.store.set_limits(memory_size=MEMORY64_LIMIT)
        instance = wasmtime.Instance(self.store, wasmtime.Module.from_file(engine, str(path)), [])
        self.exports = instance.exports(self.store)
        self.memory = self.exports["memory"]

    def call(self, name: str, *args):
        return self.exports[name](self.store, *args)

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: {self.message()}")

    def message(self) -> str:
        start = self.call("tg_error")
        raw = self.memory.read(self.store, start, start + 512)
        return bytes(raw[: raw.index(0)]).decode()

    def put(self, data: bytes) -> int:
        pointer = self.call("malloc", max(len(data), 1))
        if pointer == 0:
            raise RuntimeError(f"out of memory copying {len(data):,} bytes into the Memory64 trainer")
        self.memory.write(self.store, data, pointer)
        return pointer

    def floats(self, pointer: int, count: int) -> np.ndarray:
        return np.frombuffer(bytes(self.memory.read(self.store, pointer, pointer + 4 * count)), dtype="<f4").copy()

    def run(self, config, seed, weights, tokens, token_seed, steps, lr, batch, bench_gemm) -> dict:
        """What ``posttrainllm/assets/wasm/node_run.mjs`` does for a job, with the same answer."""
        c = config
        self.check(self.call("tg_create", c["vocab"], c["block"], c["layers"], c["heads"], c["embd"], c["batch"], 1,
                             seed), "create")
        n_params = self.call("tg_n_params")
        answer = {"threads": self.call("tg_threads"), "n_params": n_params}
        if weights is not None:
            pointer = self.put(weights)
            self.check(self.call("tg_load", pointer, len(weights)), "weights")
            self.call("free", pointer)
        self.check(self.call("tg_set_adamw", lr, 0.9, 0.999, 1e-8, 0.0), "AdamW")
        if batch is not None:
            x, y = (self.put(_exact(a, "<i4", n).tobytes()) for a, n in zip(batch, ("inputs", "targets"), strict=True))
            answer["loss"] = self.call("tg_loss_and_grads", x, y)
            if answer["loss"] != answer["loss"]:
                raise RuntimeError(f"batch: {self.message()}")
            answer["grads"] = self.floats(self.call("tg_grads"), n_params)
            answer["logits"] = self.floats(self.call("tg_logits"), c["batch"] * c["block"] * c["vocab"])
        if tokens is not None:
            ids = _exact(tokens, "<u2", "tokens")
            self.check(self.call("tg_set_tokens", self.put(ids.tobytes()), len(ids), token_seed), "tokens")
            start, losses = time.perf_counter(), []
            for _ in range(steps):
                losses.append(self.call("tg_step"))
                if losses[-1] != losses[-1]:
                    raise RuntimeError(f"step: {self.message()}")
            answer["seconds"], answer["losses"] = time.perf_counter() - start, losses
        if bench_gemm is not None:
            sizes, reps = bench_gemm
            answer["gemm"] = [self.bench_gemm(n, reps) for n in sizes]
        answer["params"] = self.floats(self.call("tg_params"), n_params)
        return answer

    def bench_gemm(self, n: int, reps: int) -> dict:
        self.call("tg_bench_gemm", n, n, n, reps)  # warm-up, as trainer.mjs does
        start = time.perf_counter()
        error = self.call("tg_bench_gemm", n, n, n, reps)
        seconds = (time.perf_counter() - start) / reps
        if error < 0:
            raise RuntimeError(f"bench_gemm: {self.message()}")
        return {"n": n, "seconds": seconds, "maxError": error}


BROWSER_FILES = ("trainer.mjs", "worker.js", "cell.js")
BROWSER_BUILDS = ("simd", "threads", "relaxed", "relaxed-threads")  # the cell picks the fastest the browser runs


def browser_cell(tok, ids, oracle: list[float], steps: tuple[int, ...] = (10, 100, 300), default: int = 100,
                 config=None, tokens: int = 1 << 16, seed: int = 0, lr: float = 3e-3):
    """The HTML for a notebook cell that trains the oracle GPT in the reader's browser: the
    trainer's JavaScript and builds, the first ``tokens`` training ids and the tokenizer's byte
    strings inlined, loaded as blob URLs — so it works in JupyterLab, the built book and a static
    host, with no server and no Python kernel. ``oracle`` holds the PyTorch oracle's first losses
    from the same initialisation and batches, which the cell plots beside the browser's own."""
    from IPython.display import HTML

    from posttrainllm.model import oracle_config

    config = config or oracle_config(tok.vocab_size)
    ids = _exact(ids[:tokens], "<u2", "ids")
    files = {name: (WASM / name).read_text(encoding="utf-8") for name in BROWSER_FILES}
    for build in BROWSER_BUILDS:
        files[f"tinygpt-{build}.mjs"] = (DIST / f"tinygpt-{build}.mjs").read_text(encoding="utf-8")
        files[f"tinygpt-{build}.wasm"] = base64.b64encode((DIST / f"tinygpt-{build}.wasm").read_bytes()).decode()
    for worker in ("tinygpt-threads.worker.js", "freestanding_worker.mjs"):
        files[worker] = (DIST / worker).read_text(encoding="utf-8")
    settings = {
        "model": trainer_config(config), "tokens": base64.b64encode(ids.tobytes()).decode(),
        "vocab": [base64.b64encode(t).decode() for t in tok.vocab], "prompt": tok.encode_ordinary("Once there was"),
        "sampleLength": 60, "oracle": [round(x, 6) for x in oracle], "stepChoices": list(steps),
        "defaultSteps": default, "seed": seed, "lr": lr,
    }
    payload = json.dumps({"files": files, "config": settings}, sort_keys=True).replace("</", "<\\/")
    cell_id = f"ptl-wasm-{hashlib.sha256(payload.encode()).hexdigest()[:8]}"
    return HTML(f"""<div class="ptl-wasm" id="{cell_id}">
<p class="ptl-status">This cell trains the tiny GPT in your browser with the WebAssembly trainer. Its script has
not run yet: in the book it starts by itself; in JupyterLab, run the cell (scripts stored in a notebook you opened
from disk stay off until it is trusted).</p>
</div>
<script type="module">
const {{files, config}} = {payload};
const root = document.getElementById("{cell_id}");
try {{
  const cell = await import(URL.createObjectURL(new Blob([files["cell.js"]], {{type: "text/javascript"}})));
  cell.mount(root, files, config);
}} catch (err) {{
  root.dataset.state = "error";
  root.querySelector(".ptl-status").textContent = "The WASM cell could not start: " + err.message;
}}
</script>""")
