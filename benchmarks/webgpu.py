"""The WGSL kernels (``posttrainllm/assets/webgpu/*.wgsl``) timed through wgpu-py, beside torch in the same run.

- matmul: every variant in ``posttrainllm/assets/webgpu/kernels.json`` at square sizes, GFLOP/s and the largest
  error against a float64 reference; beside ``torch.matmul`` in fp32 with TF32 off when CUDA is
  there (the goal: the best WGSL kernel at 75% of it or more).
- attention: naive vs the FlashAttention-2 causal forwards, 8 heads of 64, growing context,
  beside torch's ``scaled_dot_product_attention`` (the goal: within 2x of it); and the FA2
  backward pass (dQ, dK, dV) beside SDPA's backward through autograd.
- shapes: the FlashAttention-2 forwards at equal work (heads x T^2) cut as more heads or as
  longer rows, to tell a cost that grows with the work from one that grows with T.
- softmax: safe vs online, rows of growing width.

On a CPU Vulkan driver the figures check correctness only; the tables say so, and their names
end in ``_cpu``. On a GPU they end in ``_gpu`` and carry the adapter, driver and date.

    python benchmarks/webgpu.py --driver lavapipe [--quick]
    python benchmarks/webgpu.py          # VK_ICD_FILENAMES already points at a GPU's driver
    python benchmarks/webgpu.py --tables matmul --tag h100   # another GPU's table, beside the H200's
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, alone, result_suffix, write_result  # noqa: E402

from posttrainllm import webgpu  # noqa: E402

HEADS, HEAD_SIZE = 8, 64
TABLES = ("matmul", "attention", "backward", "softmax", "shapes")
# the shapes table: the same total work (heads x T^2) cut as more heads or as longer rows
SHAPES = {"gpu": [(8, 1024), (32, 1024), (8, 2048), (32, 2048), (2, 4096), (8, 4096)],
          "cpu": [(2, 128), (8, 128), (2, 256), (8, 256), (2, 512)]}


def torch_baselines(sizes: list[int], lengths: list[int], heads: int, d: int, repeat: int) -> dict:
    """torch on CUDA for the same inputs, run in a child process: sharing one process between
    CUDA and wgpu's Vulkan device lost the Vulkan device on the H200. Empty without CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {}
    for n in sizes:
        a, b = matmul_inputs(n)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        ms = cuda_ms(torch, lambda ta=ta, tb=tb: ta @ tb, repeat)
        err = float(np.abs((ta @ tb).cpu().numpy() - a.astype(np.float64) @ b.astype(np.float64)).max())
        out[f"matmul {n}"] = (2 * n**3 / ms / 1e6, err)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for t in lengths:
        q, k, v, do_np = backward_inputs(heads, t, d)
        tq, tk, tv = (torch.from_numpy(x).cuda()[None] for x in (q, k, v))
        ms = cuda_ms(torch, lambda tq=tq, tk=tk, tv=tv: sdpa(tq, tk, tv, is_causal=True), repeat)
        exact = webgpu.attention_reference(q, k, v)[0]
        err = float(np.abs(sdpa(tq, tk, tv, is_causal=True)[0].cpu().numpy() - exact).max())
        out[f"attention {t}"] = (ms, err)
        tq, tk, tv = (x.requires_grad_() for x in (tq, tk, tv))
        o = sdpa(tq, tk, tv, is_causal=True)
        do = torch.from_numpy(do_np).cuda()[None]
        ms = cuda_ms(torch, lambda o=o, do=do, x=(tq, tk, tv): torch.autograd.grad(o, x, do, retain_graph=True), repeat)
        grads = torch.autograd.grad(o, (tq, tk, tv), do)
        exact = webgpu.attention_backward_reference(q, k, v, do_np)
        err = max(float(np.abs(g[0].cpu().numpy() - e).max()) for g, e in zip(grads, exact, strict=True))
        out[f"backward {t}"] = (ms, err)
    return out


def matmul_inputs(n: int):
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)


def attention_inputs(heads: int, t: int, d: int):
    rng = np.random.default_rng(t)
    return tuple(rng.standard_normal((heads, t, d)).astype(np.float32) for _ in range(3))


def backward_inputs(heads: int, t: int, d: int):
    """q, k, v as in :func:`attention_inputs`, and the gradient dO of the loss with respect to the output."""
    do = np.random.default_rng(t + 1).standard_normal((heads, t, d)).astype(np.float32)
    return (*attention_inputs(heads, t, d), do)


def cuda_ms(torch, fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def open_gpu(args) -> webgpu.GPU:
    if args.driver:
        webgpu.use_driver(args.driver)
    return webgpu.GPU()


def adapter_facts(args) -> dict:
    """Name, info and features of the adapter, read in a process of its own like every measurement."""
    gpu = open_gpu(args)
    return {"name": gpu.name, "info": gpu.info, "features": sorted(gpu.features)}


def matmul_run(file: str, params: str, n: int, args) -> tuple:
    """One matmul kernel at one size, in a process of its own: ``(ms, error, method)``."""
    gpu = open_gpu(args)
    a, b = matmul_inputs(n)
    c, timing = gpu.matmul(a, b, file, json.loads(params), repeat=args.repeat)
    weights = b.astype(np.float16) if "f16" in file else b  # f16 kernels: compared with B as they store it
    return timing.median_ms, float(np.abs(c - a.astype(np.float64) @ weights.astype(np.float64)).max()), timing.method


def ready(variants: list[dict], adapter: dict) -> list[dict]:
    """The variants this adapter can run: those that need no optional feature it lacks."""
    return [v for v in variants if not v.get("feature") or v["feature"] in adapter["features"]]


def matmul_table(adapter: dict, args, sizes: list[int], baselines: dict, suffix: str, context: str) -> None:
    variants = webgpu.variants("matmul")
    runnable = ready(variants, adapter)
    key = {v["name"]: json.dumps(v["params"], sort_keys=True) for v in runnable}  # names are unique, files not
    measured = in_rounds(matmul_run, [(v["file"], key[v["name"]], n) for n in sizes for v in runnable], args)
    rows = []
    for n in sizes:
        torch_gflops = None
        if f"matmul {n}" in baselines:
            torch_gflops, err = baselines[f"matmul {n}"]
            rows.append([n, "torch.matmul (CUDA, fp32, TF32 off)", f"{torch_gflops:,.0f}", "1.00", f"{err:.1e}",
                         "CUDA events"])
        for v in variants:
            if v not in runnable:
                rows.append([n, v["name"], "-", "-", "-", f"needs {v['feature']}"])
                continue
            ms, err, method = measured[v["file"], key[v["name"]], n]
            gflops = 2 * n**3 / ms / 1e6
            ratio = f"{gflops / torch_gflops:.2f}" if torch_gflops else "-"
            rows.append([n, v["name"], f"{gflops:,.1f}", ratio, f"{err:.1e}", method])
    write_result(
        f"webgpu_matmul_{suffix}",
        f"WGSL matmul through wgpu-py on {adapter['name']}{context}",
        ["n", "kernel", "GFLOP/s", "vs torch", "max error", "timing"],
        rows,
        f"Square n x n fp32 (f16 kernels: B rounded to f16, compared with the same rounding). Each kernel and size "
        f"in a fresh process and device. {timing_note(args)} {adapter_note(adapter)}",
        args.out,
    )


def timing_note(args) -> str:
    runs = f"the median of {args.repeat} runs after a warm-up"
    if args.rounds == 1:
        return f"Each time: {runs}."
    return f"Each time: the median over {args.rounds} rounds, in which every kernel takes its turn, of {runs}."


def in_rounds(fn, items: list, args) -> dict:
    """``fn(item, args)`` -> ``(ms, error, method)`` for every item, each call in a fresh process,
    over ``args.rounds`` rounds with the items in turn; per item the median ms, or the first failure."""
    runs: dict = {}
    for _ in range(args.rounds):
        for item in items:
            runs.setdefault(item, []).append(alone(fn, *item, args))
    out = {}
    for item, results in runs.items():
        failed = [r for r in results if r[0] is None]
        out[item] = failed[0] if failed else (statistics.median(r[0] for r in results), max(r[1] for r in results),
                                              results[0][2])
    return out


def attention_run(file: str, params: str, t: int, args, heads: int = HEADS) -> tuple:
    """One attention kernel at one length, in a process of its own: ``(ms, error, method)``, or
    ``(None, reason, "")`` when the runtime refuses the kernel (the naive kernel's private row at
    T = 4096) or the device is lost, so one failure cannot take the rest of the table with it."""
    try:
        gpu = open_gpu(args)
        q, k, v = attention_inputs(heads, t, HEAD_SIZE)
        out, lse = webgpu.attention_reference(q, k, v)
        o, lse_gpu, timing = gpu.attention(q, k, v, file, json.loads(params), repeat=args.repeat)
        return timing.median_ms, float(max(np.abs(o - out).max(), np.abs(lse_gpu - lse).max())), timing.method
    except ValueError as err:  # refused before dispatch (the naive kernel's private row at T = 4096)
        return None, f"not run: {err}", ""
    except Exception as err:  # noqa: BLE001 - wgpu reports a lost device as a validation error
        return None, f"failed: {str(err).strip().splitlines()[-1].strip()}", ""


def attention_table(adapter: dict, args, lengths: list[int], baselines: dict, suffix: str, context: str) -> None:
    variants = webgpu.variants("attention")
    runnable = ready(variants, adapter)
    items = []
    for t in lengths:
        for variant in runnable:
            params = dict(variant["params"])
            if "naive" in variant["file"]:
                params["MAX_T"] = max(t, 1024)  # the private score row must hold the whole context
            items.append((variant["file"], json.dumps(params, sort_keys=True), t))
    measured = in_rounds(attention_run, items, args)
    rows = []
    for t in lengths:
        sdpa = baselines.get(f"attention {t}")
        if sdpa:
            rows.append([t, "torch SDPA (CUDA, fp32)", f"{sdpa[0]:.3f}", "1.00", f"{sdpa[1]:.1e}", "CUDA events"])
        times = {}
        for variant in variants:
            if variant not in runnable:
                rows.append([t, variant["name"], "-", "-", "-", f"needs {variant['feature']}"])
                continue
            item = next(i for i in items if i[2] == t and i[0] == variant["file"])
            ms, err, method = measured[item]
            if ms is None:
                rows.append([t, variant["name"], "-", "-", "-", err])
                continue
            times[variant["name"]] = ms
            ratio = f"{ms / sdpa[0]:.2f}" if sdpa else "-"
            rows.append([t, variant["name"], f"{ms:.3f}", ratio, f"{err:.1e}", method])
        if "naive" in times:
            best = min(ms for name, ms in times.items() if name != "naive")
            rows.append([t, "fastest FA2 speed-up over naive", f"{times['naive'] / best:.2f}x", "-", "-", "-"])
    write_result(
        f"webgpu_attention_{suffix}",
        f"Causal attention forward, {HEADS} heads of {HEAD_SIZE}, WGSL through wgpu-py on {adapter['name']}{context}",
        ["T", "kernel", "ms", "vs torch SDPA", "max error", "timing"],
        rows,
        f"'vs torch SDPA': time over SDPA's, lower is better. Error: the larger of the output's and the logsumexp's, "
        f"against float64 numpy. The naive kernel's MAX_T is raised to T beyond 1024 (a private row of 4T bytes per "
        f"invocation) and refused past {webgpu.PRIVATE_BYTES_LIMIT:,} bytes; each kernel runs in a fresh process and "
        f"device. {timing_note(args)} {adapter_note(adapter)}",
        args.out,
    )


def shape_run(file: str, params: str, t: int, heads: int, args) -> tuple:
    """``attention_run`` with the number of heads as well: one item of the shapes table."""
    return attention_run(file, params, t, args, heads)


def shapes_table(adapter: dict, args, suffix: str, context: str) -> None:
    """The FlashAttention-2 forwards at the same total work cut two ways: more heads, or longer rows.

    If time grew only with the work (heads x T^2), 8 heads at 2048 and 2 at 4096 would take the
    same time, and 32 at 2048 the same as 8 at 4096; the table shows where that stops holding."""
    files = [v for v in ready(webgpu.variants("attention"), adapter) if "flash2" in v["file"]]
    shapes = [(2, 64)] if args.quick else SHAPES[suffix.split("_")[0]]
    items = [(v["file"], "{}", t, heads) for heads, t in shapes for v in files]
    measured = in_rounds(shape_run, items, args)
    rows = []
    for heads, t in shapes:
        for v in files:
            ms, err, method = measured[(v["file"], "{}", t, heads)]
            work = heads * t * t / (8 * 1024 * 1024)
            rows.append([heads, t, f"{work:g}", v["name"], "-" if ms is None else f"{ms:.3f}",
                         "-" if ms is None else f"{ms / work:.3f}", err if ms is None else method])
    write_result(f"webgpu_attention_shapes_{suffix}", "FlashAttention-2 forward: the same work as more heads or as "
                 f"longer rows, on {adapter['name']}{context}",
                 ["heads", "T", "work (8 heads x 1024^2 = 1)", "kernel", "ms", "ms per unit of work", "timing"],
                 rows, f"Head size {HEAD_SIZE}; each kernel and shape in a fresh process and device. "
                 f"{timing_note(args)} {adapter_note(adapter)}", args.out)


def backward_run(t: int, args) -> tuple[float, float, str]:
    """The backward kernels at one length, in a process of its own: ``(ms, error, method)``."""
    gpu = open_gpu(args)
    q, k, v, do = backward_inputs(HEADS, t, HEAD_SIZE)
    o, lse, _ = gpu.attention(q, k, v, "attention_flash2_rows.wgsl")
    dq, dk, dv, timing = gpu.attention_backward(q, k, v, o, lse, do, repeat=args.repeat)
    exact = webgpu.attention_backward_reference(q, k, v, do)
    return timing.median_ms, max(float(np.abs(g - e).max()) for g, e in zip((dq, dk, dv), exact, strict=True)), \
        timing.method


def backward_table(adapter: dict, args, lengths: list[int], baselines: dict, suffix: str, context: str) -> None:
    measured = in_rounds(backward_run, [(t,) for t in lengths], args)  # fresh processes, as above
    rows = []
    for t in lengths:
        ms, err, method = measured[t,]
        sdpa = baselines.get(f"backward {t}")
        if sdpa:
            rows.append([t, "torch SDPA backward (CUDA, fp32, autograd)", f"{sdpa[0]:.3f}", "1.00", f"{sdpa[1]:.1e}",
                         "CUDA events"])
        ratio = f"{ms / sdpa[0]:.2f}" if sdpa else "-"
        rows.append([t, "FlashAttention-2 backward (dQ, then dK and dV)", f"{ms:.3f}", ratio, f"{err:.1e}", method])
    write_result(
        f"webgpu_attention_backward_{suffix}",
        f"Causal attention backward, {HEADS} heads of {HEAD_SIZE}, WGSL through wgpu-py on {adapter['name']}{context}",
        ["T", "kernel", "ms", "vs torch SDPA", "max error", "timing"],
        rows,
        f"dQ, dK and dV from the forward pass's output and logsumexp; error: the largest of the three against "
        f"float64 numpy through the whole probability matrix. WGSL time: the sum of the two kernels' times. "
        f"{timing_note(args)} {adapter_note(adapter)}",
        args.out,
    )


def softmax_run(args) -> tuple[list, int]:
    """The softmax rows, measured in a process of its own."""
    gpu = open_gpu(args)
    widths = [256] if args.quick else [1024, 4096, 16384]
    rows_n = 64 if args.quick else 1024
    rng = np.random.default_rng(2)
    rows = []
    for cols in widths:
        x = (rng.standard_normal((rows_n, cols)) * 20).astype(np.float32)
        e = np.exp(x - x.max(1, keepdims=True))
        exact = e / e.sum(1, keepdims=True)
        for variant in webgpu.variants("softmax"):
            y, timing = gpu.softmax(x, variant["file"], variant["params"], repeat=args.repeat)
            rows.append([cols, variant["name"], f"{timing.median_ms:.3f}", f"{np.abs(y - exact).max():.1e}",
                         timing.method])
    return rows, rows_n


def softmax_table(adapter: dict, args, suffix: str, context: str) -> None:
    rows, rows_n = alone(softmax_run, args)
    write_result(
        f"webgpu_softmax_{suffix}",
        f"Row softmax of {rows_n} rows, WGSL through wgpu-py on {adapter['name']}{context}",
        ["columns", "kernel", "ms", "max error", "timing"],
        rows,
        f"Inputs scaled by 20 so that exp without the maximum subtracted would overflow. {adapter_note(adapter)}",
        args.out,
    )


def adapter_note(adapter: dict) -> str:
    info = adapter["info"]
    return (f"Adapter: {info.get('device')} ({info.get('adapter_type')}), {info.get('backend_type')}, "
            f"driver {info.get('description') or info.get('vendor')}; measured {datetime.date.today().isoformat()}.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=sorted(webgpu.DRIVERS), help="a CPU Vulkan driver (default: the system's)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few runs (a smoke test)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per kernel, kernels in turn")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="which tables to measure")
    parser.add_argument("--tag", help="appended to the result files' names (default: none on an H200, else "
                        "the GPU's model, e.g. h100)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.rounds = 2, 1
    if args.driver:
        webgpu.use_driver(args.driver)
    cpu = args.driver is not None
    sizes = [64] if args.quick else ([256, 512] if cpu else [1024, 2048, 4096])  # quick: one size of each
    lengths = [64] if args.quick else ([128, 256, 512] if cpu else [512, 1024, 2048, 4096])
    baselines = {}
    if not cpu:  # before any wgpu device: see torch_baselines
        baselines = alone(torch_baselines, sizes, lengths, HEADS, HEAD_SIZE, args.repeat)
    adapter = alone(adapter_facts, args)  # this process never opens a device
    if (adapter["info"].get("adapter_type") == "CPU") != cpu:
        raise SystemExit(f"--driver says {'a CPU driver' if cpu else 'a GPU'}, but the adapter is {adapter['name']}")
    suffix, context = ("cpu", " (a CPU driver: correctness only, not GPU speed)") if cpu else ("gpu", "")
    suffix += result_suffix("" if cpu and args.tag is None else args.tag, adapter["name"])  # CPU: plain unless tagged
    if "matmul" in args.tables:
        matmul_table(adapter, args, sizes, baselines, suffix, context)
    if "attention" in args.tables:
        attention_table(adapter, args, lengths, baselines, suffix, context)
    if "backward" in args.tables:
        backward_table(adapter, args, lengths, baselines, suffix, context)
    if "softmax" in args.tables:
        softmax_table(adapter, args, suffix, context)
    if "shapes" in args.tables:
        shapes_table(adapter, args, suffix, context)

if __name__ == "__main__":
    main()
