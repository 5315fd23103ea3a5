"""The WGSL kernels (``webgpu/*.wgsl``) timed through wgpu-py, beside torch in the same run.

- matmul: every variant in ``webgpu/kernels.json`` at square sizes, GFLOP/s and the largest
  error against a float64 reference; beside ``torch.matmul`` in fp32 with TF32 off when CUDA is
  there (the goal: the best WGSL kernel at 50% of it or more).
- attention: naive vs FlashAttention-2 causal forward, 8 heads of 64, growing context (the goal:
  FA2 faster than naive from T = 1024), beside torch's ``scaled_dot_product_attention``.
- softmax: safe vs online, rows of growing width.

On a CPU Vulkan driver the figures check correctness only; the tables say so, and their names
end in ``_cpu``. On a GPU they end in ``_gpu`` and carry the adapter, driver and date.

    python benchmarks/webgpu.py --driver lavapipe [--quick]
    python benchmarks/webgpu.py          # VK_ICD_FILENAMES already points at a GPU's driver
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import webgpu  # noqa: E402


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


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


def matmul_table(gpu: webgpu.GPU, args, suffix: str, context: str) -> None:
    torch = torch_cuda()
    sizes = [64, 128] if args.quick else ([1024, 2048, 4096] if suffix == "gpu" else [256, 512])
    rng = np.random.default_rng(0)
    rows = []
    best = {}
    for n in sizes:
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        reference = a.astype(np.float64) @ b.astype(np.float64)
        flop = 2 * n**3
        torch_gflops = None
        if torch is not None:
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            torch_gflops = flop / cuda_ms(torch, lambda ta=ta, tb=tb: ta @ tb, args.repeat) / 1e6
            rows.append([n, "torch.matmul (CUDA, fp32, TF32 off)", f"{torch_gflops:,.0f}", "1.00",
                         f"{np.abs((ta @ tb).cpu().numpy() - reference).max():.1e}", "CUDA events"])
        for v in webgpu.variants("matmul"):
            if v.get("feature") and v["feature"] not in gpu.features:
                rows.append([n, v["name"], "-", "-", "-", f"needs {v['feature']}"])
                continue
            c, timing = gpu.matmul(a, b, v["file"], v["params"], repeat=args.repeat)
            exact = reference if "f16" not in v["file"] else a.astype(np.float64) @ b.astype(np.float16).astype(float)
            gflops = flop / timing.median_ms / 1e6
            best[n] = max(best.get(n, 0.0), gflops)
            ratio = f"{gflops / torch_gflops:.2f}" if torch_gflops else "-"
            rows.append([n, v["name"], f"{gflops:,.1f}", ratio, f"{np.abs(c - exact).max():.1e}", timing.method])
    write_result(
        f"webgpu_matmul_{suffix}",
        f"WGSL matmul through wgpu-py on {gpu.name}{context}",
        ["n", "kernel", "GFLOP/s", "vs torch", "max error", "timing"],
        rows,
        f"Square n x n fp32 (f16 kernels: B rounded to f16, compared with the same rounding). Median of "
        f"{args.repeat} runs after a warm-up. {adapter_note(gpu)}",
        args.out,
    )


def attention_table(gpu: webgpu.GPU, args, suffix: str, context: str) -> None:
    torch = torch_cuda()
    heads, d = 8, 64
    lengths = [64, 128] if args.quick else ([512, 1024, 2048, 4096] if suffix == "gpu" else [128, 256, 512])
    rng = np.random.default_rng(1)
    rows = []
    for t in lengths:
        q, k, v = (rng.standard_normal((heads, t, d)).astype(np.float32) for _ in range(3))
        out, lse = webgpu.attention_reference(q, k, v)
        times = {}
        for variant in webgpu.variants("attention"):
            params = dict(variant["params"])
            if "naive" in variant["file"]:
                params["MAX_T"] = max(t, 1024)  # the private score row must hold the whole context
            o, lse_gpu, timing = gpu.attention(q, k, v, variant["file"], params, repeat=args.repeat)
            times[variant["name"]] = timing.median_ms
            err = max(np.abs(o - out).max(), np.abs(lse_gpu - lse).max())
            rows.append([t, variant["name"], f"{timing.median_ms:.3f}", f"{err:.1e}", timing.method])
        naive, flash = times["naive"], times["FlashAttention-2"]
        rows.append([t, "FA2 speed-up over naive", f"{naive / flash:.2f}x", "-", "-"])
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(x).cuda()[None] for x in (q, k, v))
            sdpa = torch.nn.functional.scaled_dot_product_attention
            ms = cuda_ms(torch, lambda tq=tq, tk=tk, tv=tv, f=sdpa: f(tq, tk, tv, is_causal=True), args.repeat)
            err = np.abs(sdpa(tq, tk, tv, is_causal=True)[0].cpu().numpy() - out).max()
            rows.append([t, "torch SDPA (CUDA, fp32)", f"{ms:.3f}", f"{err:.1e}", "CUDA events"])
    write_result(
        f"webgpu_attention_{suffix}",
        f"Causal attention forward, {heads} heads of {d}, WGSL through wgpu-py on {gpu.name}{context}",
        ["T", "kernel", "ms", "max error", "timing"],
        rows,
        f"Error: the larger of the output's and the logsumexp's, against float64 numpy. The naive kernel's MAX_T is "
        f"raised to T beyond 1024. {adapter_note(gpu)}",
        args.out,
    )


def softmax_table(gpu: webgpu.GPU, args, suffix: str, context: str) -> None:
    widths = [256, 1024] if args.quick else [1024, 4096, 16384]
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
    write_result(
        f"webgpu_softmax_{suffix}",
        f"Row softmax of {rows_n} rows, WGSL through wgpu-py on {gpu.name}{context}",
        ["columns", "kernel", "ms", "max error", "timing"],
        rows,
        f"Inputs scaled by 20 so that exp without the maximum subtracted would overflow. {adapter_note(gpu)}",
        args.out,
    )


def adapter_note(gpu: webgpu.GPU) -> str:
    info = gpu.info
    return (f"Adapter: {info.get('device')} ({info.get('adapter_type')}), {info.get('backend_type')}, "
            f"driver {info.get('description') or info.get('vendor')}; measured {datetime.date.today().isoformat()}.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=sorted(webgpu.DRIVERS), help="a CPU Vulkan driver (default: the system's)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few runs (a smoke test)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat = 2
    if args.driver:
        webgpu.use_driver(args.driver)
    gpu = webgpu.GPU()
    cpu = gpu.info.get("adapter_type") == "CPU"
    suffix, context = ("cpu", " (a CPU driver: correctness only, not GPU speed)") if cpu else ("gpu", "")
    matmul_table(gpu, args, suffix, context)
    attention_table(gpu, args, suffix, context)
    softmax_table(gpu, args, suffix, context)


if __name__ == "__main__":
    main()
