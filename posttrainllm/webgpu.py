"""Run the book's WGSL kernels (``posttrainllm/assets/webgpu/*.wgsl``) from Python, through wgpu-py.

The browser cells run these same files on the reader's GPU through ``posttrainllm/assets/webgpu/runtime.js``;
this module is the other runtime, so that pytest can check every kernel against numpy on a
CPU Vulkan driver (Mesa's lavapipe, or Chromium's SwiftShader) and the benchmarks can time them
on a real GPU. Both runtimes follow the same three rules, read from the WGSL itself:

- **Parameters** are ``const NAME: u32 = 16u;`` lines, rewritten before compiling. (WGSL's
  ``override`` constants cannot size private arrays, which register blocking needs.)
- **Bind group layouts** are derived from each ``var<storage, read>`` / ``var<storage,
  read_write>`` / ``var<uniform>`` declaration, so a layout can never disagree with the shader
  — the seed's gotcha, where a mismatch silently returned wrong data.
- **Grids**: a matmul kernel covers ``BM x BN`` of C per workgroup, an attention kernel ``BR``
  query rows of one head, a softmax kernel one row.

The Vulkan driver is chosen by the ``VK_ICD_FILENAMES`` environment variable, read once per
process when wgpu starts: :func:`use_driver` sets it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm import assets

if TYPE_CHECKING:  # numpy is imported where kernels run: reading, checking and inlining them needs
    import numpy as np  # only the standard library, so these cells run in an offline Pyodide too

KERNELS = assets.folder("webgpu")
DRIVERS = {
    "lavapipe": "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",  # Debian's mesa-vulkan-drivers
    "swiftshader": "/usr/lib/chromium/vk_swiftshader_icd.json",  # shipped inside Debian's chromium
}
# The most private-array memory per invocation the book dispatches: the naive attention kernel's
# rows at MAX_T = 2048 (8,192 bytes of scores and 256 of output), the largest that ran on the
# H200; at MAX_T = 4096 (16,640 bytes) the H200's Vulkan device was lost. runtime.js holds the same.
PRIVATE_BYTES_LIMIT = 8448
_CONST = re.compile(r"^const (\w+): (\w+) = ([^;]+);", re.MULTILINE)
_BINDING = re.compile(r"@binding\((\d+)\)\s+var<(storage, read_write|storage, read|storage|uniform)>")
LAYOUT_TYPES = {"storage, read": "read-only-storage", "storage, read_write": "storage", "storage": "read-only-storage",
                "uniform": "uniform"}


def use_driver(name: str) -> None:
    """Select a Vulkan driver (a key of :data:`DRIVERS`) for this process, before wgpu starts."""
    if name not in DRIVERS:
        raise ValueError(f"unknown driver {name!r}; choose one of {sorted(DRIVERS)}")
    if not Path(DRIVERS[name]).is_file():
        hint = "apt-get install mesa-vulkan-drivers" if name == "lavapipe" else "apt-get install chromium"
        raise FileNotFoundError(f"the {name} Vulkan driver is not installed ({DRIVERS[name]} is missing): {hint}")
    os.environ["VK_ICD_FILENAMES"] = DRIVERS[name]
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def variants(kind: str) -> list[dict]:
    """The kernel variants of ``kind`` ("matmul", "softmax", "attention", "attention_backward") that the
    book races and tests."""
    return json.loads((KERNELS / "kernels.json").read_text(encoding="utf-8"))[kind]


def source(file: str, params: dict | None = None) -> str:
    """The WGSL of ``posttrainllm/assets/webgpu/<file>`` with the named ``const`` parameters replaced."""
    text = (KERNELS / file).read_text(encoding="utf-8")
    params = dict(params or {})
    unknown = set(params) - {m.group(1) for m in _CONST.finditer(text)}
    if unknown:
        known = [m.group(1) for m in _CONST.finditer(text)]
        raise ValueError(f"{file} has no parameter {sorted(unknown)}; its constants are {known}")

    def rewrite(match: re.Match) -> str:
        name, kind, value = match.groups()
        if name not in params:
            return match.group(0)
        return f"const {name}: {kind} = {int(params[name])}{'u' if kind == 'u32' else ''};"

    return _CONST.sub(rewrite, text)


def constants(wgsl: str) -> dict[str, int]:
    """The integer constants of a kernel: literals, and names of earlier constants (``BM = TILE``)."""
    values: dict[str, int] = {}
    for name, _, value in _CONST.findall(wgsl):
        value = value.strip().rstrip("u")
        if value.isdigit():
            values[name] = int(value)
        elif value in values:
            values[name] = values[value]
    return values


def bindings(wgsl: str) -> list[tuple[int, str]]:
    """``(binding, layout type)`` of every resource the shader declares, in binding order."""
    return sorted((int(b), LAYOUT_TYPES[kind]) for b, kind in _BINDING.findall(wgsl))


def _evaluate(expr: str, values: dict[str, int]) -> int:
    """An integer WGSL constant expression: literals, known constants, + - * / and parentheses."""
    import ast

    ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.Div: int.__floordiv__}

    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in ops:  # u32 division truncates, as in WGSL
            return ops[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"cannot evaluate {expr!r}")

    return walk(ast.parse(re.sub(r"(\d+)u\b", r"\1", expr.strip()), mode="eval").body)


def _all_constants(wgsl: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for name, _, value in _CONST.findall(wgsl):
        values[name] = _evaluate(value, values)
    return values


_SIZES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2, "vec4<f32>": 16, "vec2<f32>": 8}


def resources(wgsl: str) -> dict[str, int]:
    """What a kernel asks of the GPU, evaluated from its source: ``invocations`` per workgroup,
    ``workgroup_bytes`` (its ``var<workgroup>`` arrays) and ``private_array_bytes`` (the arrays each
    invocation declares for itself, which the GPU must fit in registers or spill)."""
    values = _all_constants(wgsl)
    size = re.search(r"@workgroup_size\(([^)]*)\)", wgsl)[1]
    invocations = math.prod(_evaluate(d, values) for d in size.split(","))
    arrays = re.findall(r"var<workgroup>\s+\w+:\s*array<(\w+|vec\d<\w+>),\s*([^;]+)>;", wgsl)
    private = re.findall(r"^\s+var \w+: array<(\w+|vec\d<\w+>),\s*([^;]+)>;", wgsl, re.MULTILINE)
    return {"invocations": invocations,
            "workgroup_bytes": sum(_SIZES[t] * _evaluate(n, values) for t, n in arrays),
            "private_array_bytes": sum(_SIZES[t] * _evaluate(n, values) for t, n in private)}


def excerpt(file: str, start: str) -> str:
    """From the line of ``posttrainllm/assets/webgpu/<file>`` that begins with ``start`` to the end of that top-level
    block (the next line that is just ``}``): one function of a .js or .wgsl file, for the book."""
    lines = (KERNELS / file).read_text(encoding="utf-8").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    if first is None:
        raise ValueError(f"no line of {file} starts with {start!r}")
    last = next(i for i in range(first, len(lines)) if lines[i] == "}")
    return "\n".join(lines[first : last + 1])


def check_shapes(what: str, ndim: int, **arrays) -> None:
    """Arrays a kernel is about to get: each ``ndim``-dimensional and non-empty, or a ``ValueError``
    in the reader's words (wgpu's own, later, would name buffers and bindings instead)."""
    for name, x in arrays.items():
        if x.ndim != ndim:
            raise ValueError(f"{what}: {name} must have {ndim} dimensions, got shape {x.shape}")
        if 0 in x.shape:
            raise ValueError(f"{what}: {name} is empty (shape {x.shape}); the kernel needs at least one element")


def check_private_bytes(file: str, nbytes: int) -> None:
    """Refuse, before it is compiled, a kernel whose private arrays exceed :data:`PRIVATE_BYTES_LIMIT`:
    a GPU spills them to slow memory, and past the limit a lost device is what was seen."""
    if nbytes > PRIVATE_BYTES_LIMIT:
        raise ValueError(f"{file} would keep {nbytes:,} bytes of private arrays per invocation; the book stops at "
                         f"{PRIVATE_BYTES_LIMIT:,} (the most that ran on an H200; 16,640 lost its device). "
                         f"FlashAttention-2 keeps no score row and runs at any length")


@dataclass
class Timing:
    median_ms: float
    runs: int
    method: str  # "timestamp-query" (GPU clock, compute pass only) or "wall-clock" (submit to readback)


class GPU:
    """One WebGPU adapter and device, with compiled pipelines cached by (file, params)."""

    def __init__(self) -> None:
        try:
            import wgpu
        except ModuleNotFoundError as err:
            if err.name != "wgpu":
                raise
            raise ModuleNotFoundError("running the book's WGSL kernels from Python needs wgpu-py: "
                                      "pip install 'posttrainllm[webgpu]'", name="wgpu") from None

        self.wgpu = wgpu
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise RuntimeError("no WebGPU adapter: is a Vulkan driver installed? (see posttrainllm.webgpu.DRIVERS)")
        self.info = dict(adapter.info)
        offered = set(adapter.features)
        wanted = [f for f in ("shader-f16", "timestamp-query", "subgroup") if f in offered]
        # the book names features as WebGPU does; wgpu-native says "subgroup" for "subgroups"
        self.features = {"subgroups" if f == "subgroup" else f for f in offered}
        limits = {k: adapter.limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                                 "max-compute-workgroup-storage-size")}
        self.device = adapter.request_device_sync(required_features=wanted, required_limits=limits)
        self.limits = dict(self.device.limits)
        self._pipelines: dict = {}

    @property
    def name(self) -> str:
        return f"{self.info.get('device', '?')} ({self.info.get('adapter_type', '?')}, {self.info.get('backend_type')})"

    def pipeline(self, file: str, params: dict | None = None):
        """Compile ``assets/webgpu/<file>`` with ``params`` (cached); returns ``(pipeline, layout, constants)``."""
        key = (file, json.dumps(params or {}, sort_keys=True))
        if key not in self._pipelines:
            self._pipelines[key] = self.compile(source(file, params), label=file)
        return self._pipelines[key]

    def compile(self, wgsl: str, label: str = "kernel"):
        """A compute pipeline for entry point ``main``, its bind group layout derived from the WGSL's
        own declarations, and its constants. A WGSL error raises with the compiler's message (line
        and column); a kernel needing a missing optional feature says which, and one whose private
        arrays pass :data:`PRIVATE_BYTES_LIMIT` is refused before the driver compiles it."""
        for enable, feature in (("enable f16;", "shader-f16"), ("enable subgroups;", "subgroups")):
            if enable in wgsl and feature not in self.features:
                raise RuntimeError(f"{label} needs the WebGPU feature {feature}, which {self.name} lacks")
        # naga (wgpu's compiler) has the subgroup builtins but rejects the directive that WGSL, and
        # so the browser, requires
        wgsl = wgsl.replace("enable subgroups;", "")
        # checked before the driver sees the kernel: on the H200, handing it the naive kernel at
        # MAX_T = 4096 lost the device
        needs = resources(wgsl)
        check_private_bytes(label, needs["private_array_bytes"])
        offered = self.limits["max-compute-workgroup-storage-size"]
        if needs["workgroup_bytes"] > offered:
            raise RuntimeError(f"{label} needs {needs['workgroup_bytes']:,} bytes of workgroup memory; {self.name} "
                               f"offers {offered:,}")
        usage = self.wgpu.ShaderStage.COMPUTE
        entries = [{"binding": b, "visibility": usage, "buffer": {"type": t}} for b, t in bindings(wgsl)]
        layout = self.device.create_bind_group_layout(entries=entries)
        module = self.device.create_shader_module(code=wgsl, label=label)
        pipeline = self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": "main"})
        return pipeline, layout, constants(wgsl)

    def _buffers(self, arrays: list[np.ndarray], outputs: list[int], uniform: np.ndarray):
        import numpy as np

        usage = self.wgpu.BufferUsage
        buffers = []
        for a in arrays:
            data = np.ascontiguousarray(a).view(np.uint8).ravel()
            data = np.pad(data, (0, -len(data) % 4))  # f16 arrays of odd length: whole 4-byte words
            buffers.append(self.device.create_buffer_with_data(data=data, usage=usage.STORAGE))
        for nbytes in outputs:
            buffers.append(self.device.create_buffer(size=max(nbytes, 4), usage=usage.STORAGE | usage.COPY_SRC))
        buffers.append(self.device.create_buffer_with_data(data=uniform, usage=usage.UNIFORM))
        return buffers

    def dispatch(self, file: str, params: dict | None, arrays: list[np.ndarray], outputs: list[tuple],
                 uniform: np.ndarray, grid, repeat: int = 0) -> tuple[list[np.ndarray], Timing | None]:
        """Run a kernel once (and ``repeat`` more times, timed); returns its outputs, each
        ``(shape, dtype)`` in ``outputs``, and the timing when ``repeat`` > 0."""
        import numpy as np

        pipeline, layout, _ = self.pipeline(file, params)
        sizes = [int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in outputs]
        buffers = self._buffers(arrays, sizes, uniform.astype(np.uint32))
        group = self.device.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)])
        grid = tuple(int(g) for g in grid)
        limit = self.limits["max-compute-workgroups-per-dimension"]
        if max(grid) > limit:
            raise ValueError(f"a grid of {grid} workgroups exceeds this device's limit of {limit} per dimension")

        def submit(timestamps=None):
            encoder = self.device.create_command_encoder()
            kwargs = {}
            if timestamps is not None:
                kwargs["timestamp_writes"] = {"query_set": timestamps[0], "beginning_of_pass_write_index": 0,
                                              "end_of_pass_write_index": 1}
            compute = encoder.begin_compute_pass(**kwargs)
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*grid)
            compute.end()
            if timestamps is not None:
                encoder.resolve_query_set(timestamps[0], 0, 2, timestamps[1], 0)
            self.device.queue.submit([encoder.finish()])

        submit()
        results = [np.frombuffer(self.device.queue.read_buffer(b)[: n], dtype=dtype).reshape(shape).copy()
                   for b, n, (shape, dtype) in zip(buffers[len(arrays):], sizes, outputs, strict=False)]
        timing = self._time(submit, buffers[len(arrays)], repeat) if repeat else None
        for b in buffers:  # free GPU memory now, not whenever Python collects the objects
            b.destroy()
        return results, timing

    def _time(self, submit, output, repeat: int) -> Timing:
        """Median over ``repeat`` runs after the warm-up run above. GPU timestamps where the device
        has them; otherwise wall clock from submit to a small readback (which waits for the GPU)."""
        import numpy as np

        times = []
        if "timestamp-query" in self.features:
            usage = self.wgpu.BufferUsage
            query = self.device.create_query_set(type="timestamp", count=2)
            resolved = self.device.create_buffer(size=16, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
            for _ in range(repeat):
                submit((query, resolved))
                start, end = np.frombuffer(self.device.queue.read_buffer(resolved), dtype=np.uint64)
                times.append((int(end) - int(start)) / 1e6)  # WebGPU timestamps are nanoseconds
            if all(t > 0 for t in times):
                return Timing(statistics.median(times), repeat, "timestamp-query")
            times = []  # some drivers write zeros: fall back to the wall clock
        for _ in range(repeat):
            t0 = time.perf_counter()
            submit()
            self.device.queue.read_buffer(output, 0, 4)
            times.append((time.perf_counter() - t0) * 1e3)
        return Timing(statistics.median(times), repeat, "wall-clock")

    def matmul(self, a: np.ndarray, b: np.ndarray, file: str = "matmul_tiled.wgsl", params: dict | None = None,
               repeat: int = 0) -> tuple[np.ndarray, Timing | None]:
        """``a @ b`` (f32; ``b`` as f16 for the f16 kernels) by one of the matmul kernels."""
        import numpy as np

        check_shapes("matmul", 2, a=a, b=b)
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise ValueError(f"cannot multiply {a.shape} by {b.shape}: inner sizes differ")
        _, _, consts = self.pipeline(file, params)
        align = consts.get("ALIGN", 1)
        kp, np_ = -(-k // align) * align, -(-n // align) * align  # zero padding a vec4 kernel needs
        a = np.pad(a.astype(np.float32), ((0, 0), (0, kp - k)))
        wdtype = np.float16 if "f16" in file else np.float32
        b = np.pad(b.astype(wdtype), ((0, kp - k), (0, np_ - n)))
        grid = (-(-np_ // consts["BN"]), -(-m // consts["BM"]), 1)
        (c,), timing = self.dispatch(file, params, [a, b], [((m, np_), np.float32)],
                                     np.array([m, np_, kp, 0]), grid, repeat)
        return c[:, :n], timing

    def softmax(self, x: np.ndarray, file: str = "softmax_online.wgsl", params: dict | None = None,
                repeat: int = 0) -> tuple[np.ndarray, Timing | None]:
        """Softmax over the last axis of a 2-D f32 array."""
        import numpy as np

        check_shapes("softmax", 2, x=x)
        rows, cols = x.shape
        (y,), timing = self.dispatch(file, params, [x.astype(np.float32)], [((rows, cols), np.float32)],
                                     np.array([rows, cols, 0, 0]), (rows, 1, 1), repeat)
        return y, timing

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, file: str = "attention_flash2.wgsl",
                  params: dict | None = None, repeat: int = 0):
        """Causal attention of ``(H, T, D)`` arrays: returns ``(output, logsumexp, timing)``."""
        import numpy as np

        check_shapes("attention", 3, q=q, k=k, v=v)
        if not q.shape == k.shape == v.shape:  # causal self-attention: keys as long as the queries
            raise ValueError(f"attention: q, k and v must have the same (heads, length, head size) shape, got "
                             f"{q.shape}, {k.shape} and {v.shape}")
        h, t, d = q.shape
        _, _, consts = self.pipeline(file, params)
        if d != consts["D"]:
            raise ValueError(f"{file} is compiled for head size D={consts['D']}, got {d}: pass params={{'D': {d}}}")
        if t > consts.get("MAX_T", t):
            raise ValueError(f"{file} keeps a private score row of MAX_T={consts['MAX_T']} floats; T={t} is longer")
        arrays = [np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v)]
        (o, lse), timing = self.dispatch(file, params, arrays, [((h, t, d), np.float32), ((h, t), np.float32)],
                                         np.array([h, t, 0, 0]), (-(-t // consts["BR"]), h, 1), repeat)
        return o, lse, timing

    def attention_backward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
                           do: np.ndarray, params: dict | None = None, repeat: int = 0):
        """The gradients ``(dq, dk, dv, timing)`` of causal attention with respect to ``(H, T, D)``
        arrays q, k and v, given the forward pass's output ``o`` and logsumexp ``lse`` and the
        gradient ``do`` of the loss with respect to ``o``: ``attention_flash2_backward_dq.wgsl``
        (which also returns each row's ``delta``), then ``attention_flash2_backward_dkdv.wgsl``.
        ``timing`` is the sum of the two kernels' medians."""
        import numpy as np

        check_shapes("attention backward", 3, q=q, k=k, v=v, o=o, do=do)
        if not q.shape == k.shape == v.shape == o.shape == do.shape:
            raise ValueError(f"attention backward: q, k, v, o and do must have one (heads, length, head size) shape, "
                             f"got {[x.shape for x in (q, k, v, o, do)]}")
        h, t, d = q.shape
        if lse.shape != (h, t):
            raise ValueError(f"attention backward: lse must have shape {(h, t)} (heads, length), got {lse.shape}")
        files = ("attention_flash2_backward_dq.wgsl", "attention_flash2_backward_dkdv.wgsl")
        consts = [self.pipeline(f, params)[2] for f in files]
        if d != consts[0]["D"]:
            raise ValueError(f"the backward kernels are written for head size D={consts[0]['D']}, got {d}")
        q, k, v, o, do = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v, o, do))
        lse = np.ascontiguousarray(lse, dtype=np.float32)
        dims = np.array([h, t, 0, 0])
        (dq, delta), t1 = self.dispatch(files[0], params, [q, k, v, o, do, lse], [((h, t, d), np.float32),
                                        ((h, t), np.float32)], dims, (-(-t // consts[0]["BR"]), h, 1), repeat)
        (dk, dv), t2 = self.dispatch(files[1], params, [q, k, v, do, lse, delta], [((h, t, d), np.float32)] * 2,
                                     dims, (-(-t // consts[1]["BC"]), h, 1), repeat)
        timing = Timing(t1.median_ms + t2.median_ms, repeat, t1.method) if repeat else None
        return dq, dk, dv, timing


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Causal softmax attention in float64 numpy: ``(output, logsumexp)``, the kernels' oracle."""
    import numpy as np

    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    t = q.shape[1]
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    m = scores.max(-1, keepdims=True)
    p = np.exp(scores - m)
    return (p / p.sum(-1, keepdims=True)) @ v, (m + np.log(p.sum(-1, keepdims=True)))[..., 0]


def attention_backward_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                 do: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` of causal softmax attention in float64 numpy, through the whole T x T
    probability matrix: the backward kernels' oracle."""
    import numpy as np

    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    scale = 1 / np.sqrt(q.shape[-1])
    t = q.shape[1]
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), q @ k.transpose(0, 2, 1) * scale, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = do @ v.transpose(0, 2, 1)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))  # the softmax's Jacobian applied to dp
    return ds @ k * scale, ds.transpose(0, 2, 1) @ q * scale, p.transpose(0, 2, 1) @ do


def browser_cell(kind: str):
    """The HTML for a notebook cell that runs the ``kind`` kernels ("matmul" or "attention") on
    the reader's GPU: ``assets/webgpu/runtime.js``, ``assets/webgpu/cells.js`` and the kernel sources inlined
    and loaded as blob-URL modules, so the same output works in JupyterLab, in the built book and
    on a static host, with no server and no Python kernel behind the page."""
    from IPython.display import HTML

    if kind not in ("matmul", "attention"):
        raise ValueError(f"no browser cell for {kind!r}; choose 'matmul' or 'attention'")
    chosen = [{**v, "workgroup_bytes": resources(source(v["file"], v["params"]))["workgroup_bytes"]}
              for v in variants(kind)]  # so the page can skip, with the reason, what its GPU cannot hold
    files = {name: (KERNELS / name).read_text(encoding="utf-8") for name in ("runtime.js", "cells.js")}
    files.update({v["file"]: (KERNELS / v["file"]).read_text(encoding="utf-8") for v in chosen})
    payload = json.dumps({"files": files, "config": {"kind": kind, "variants": chosen}}, sort_keys=True)
    payload = payload.replace("</", "<\\/")  # a "</script>" inside a string must not end the script
    cell_id = f"ptl-webgpu-{kind}-{hashlib.sha256(payload.encode()).hexdigest()[:8]}"
    return HTML(f"""<div class="ptl-webgpu" id="{cell_id}" data-kind="{kind}">
<p class="ptl-status">This cell runs the book's WGSL kernels on your GPU through WebGPU. Its script has not
run yet: in the book it starts by itself; in JupyterLab, run the cell (scripts stored in a notebook you
opened from disk stay off until it is trusted).</p>
</div>
<script type="module">
const {{files, config}} = {payload};
const load = (name) => import(URL.createObjectURL(new Blob([files[name]], {{type: "text/javascript"}})));
const root = document.getElementById("{cell_id}");
try {{
  const [runtime, cells] = await Promise.all([load("runtime.js"), load("cells.js")]);
  await cells.mount(root, runtime, files, config);
}} catch (err) {{
  root.dataset.state = "error";
  root.querySelector(".ptl-status").textContent = "The WebGPU cell could not start: " + err.message;
}}
</script>""")
