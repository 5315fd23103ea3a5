"""The WASM trainer beside the PyTorch oracle on the CPU: training tokens/s and matmul GFLOP/s.

- Training: module 7's GPT, batch 16 x 64, the same steps on the same batches, in each WASM
  build under node (scalar, SIMD and relaxed SIMD, each alone and with threads, on 1 and 2
  threads), the Memory64 build in wasmtime, and in PyTorch on 1 and 2 threads. PyTorch runs three
  times: on the kernels it picks for this CPU, and held to AVX2 and to 128-bit vectors (what it
  runs on CPUs without AVX-512, and without AVX), each in its own process. Every contender runs
  ``--rounds`` times, in turn, and keeps its median. The goal: the fastest WASM build at PyTorch's
  tokens/s (PyTorch on this CPU's own kernels) on 1 and 2 threads.
- Matmul: the trainer's own gemm (``tg_bench_gemm``) on n x n x n products, beside numpy's
  (OpenBLAS) on the same thread counts.

    python benchmarks/wasm.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import wasm  # noqa: E402
from posttrainllm.model import oracle_setup  # noqa: E402

CONTENDERS = [("scalar", 1), ("simd", 1), ("relaxed", 1), ("threads", 1), ("threads", 2), ("relaxed-threads", 1),
              ("relaxed-threads", 2), ("memory64", 1)]
# PyTorch's CPU code paths: ATen's own kernels, MKL's and oneDNN's, each capped by its own variable
TORCH_PATHS = {
    "this CPU's kernels": {},
    "held to AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "held to 128-bit vectors": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                                "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
NUMPY_GEMM = """
import json, sys, time
import numpy as np
n, reps = int(sys.argv[1]), int(sys.argv[2])
a, b = np.ones((n, n), np.float32), np.ones((n, n), np.float32)
a @ b
start = time.perf_counter()
for _ in range(reps):
    a @ b
print(json.dumps((time.perf_counter() - start) / reps))
"""


def torch_seconds(steps: int, threads: int) -> float:
    """Seconds for ``steps`` oracle training steps on ``threads`` threads, in this process."""
    import torch

    torch.set_num_threads(threads)
    config, _, ids, _ = oracle_setup()
    model = wasm.oracle_at_init(config)
    wasm.oracle_losses(model, ids, 2, wasm.BATCH)  # warm-up
    start = time.perf_counter()
    wasm.oracle_losses(model, ids, steps, wasm.BATCH)
    return time.perf_counter() - start


def torch_run(path: str, steps: int, threads: int) -> dict:
    """``torch_seconds`` in a fresh process on one of PyTorch's code paths; with the capability it ran."""
    env = {**os.environ, **TORCH_PATHS[path]}
    code = ("import json, sys, torch; sys.path.insert(0, sys.argv[1]); import wasm as bench; "
            "s = bench.torch_seconds(int(sys.argv[2]), int(sys.argv[3])); "
            "print(json.dumps({'seconds': s, 'capability': torch.backends.cpu.get_cpu_capability()}))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(steps), str(threads)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def training(config, ids, steps: int, rounds: int, out: Path) -> None:
    tokens = steps * wasm.BATCH * config.block_size
    seconds: dict[tuple[str, int], list[float]] = {}
    capabilities = {}
    for _ in range(rounds):  # in turn, so a slow spell of the machine hits every contender alike
        for path in TORCH_PATHS:
            for threads in (1, 2):
                answer = torch_run(path, steps, threads)
                capabilities[path] = answer["capability"]
                seconds.setdefault((f"PyTorch, {path}", threads), []).append(answer["seconds"])
        for build, threads in CONTENDERS:
            answer = wasm.run(build, wasm.trainer_config(config), threads=threads, tokens=ids, steps=steps)
            name = f"WASM {build}" + (" (wasmtime)" if build == "memory64" else "")
            seconds.setdefault((name, threads), []).append(answer["seconds"])
    median = {key: statistics.median(runs) for key, runs in seconds.items()}
    native = {threads: median[("PyTorch, this CPU's kernels", threads)] for threads in (1, 2)}
    narrow = {threads: median[("PyTorch, held to 128-bit vectors", threads)] for threads in (1, 2)}
    rows = [[name, threads, f"{tokens / s:,.0f}", f"{s / steps * 1e3:.1f}", f"{native[threads] / s:.2f}x",
             f"{narrow[threads] / s:.2f}x"] for (name, threads), s in median.items()]
    best = {threads: min(s for (name, t), s in median.items() if t == threads and name.startswith("WASM"))
            for threads in (1, 2)}
    write_result(
        "wasm_training",
        f"Training module 7's GPT ({steps} steps, batch {wasm.BATCH} x {config.block_size}): WASM under node beside "
        f"PyTorch; the fastest WASM build at {native[1] / best[1]:.2f}x / {native[2] / best[2]:.2f}x PyTorch's "
        f"tokens/s on 1 / 2 threads (goal: 1.0x), {narrow[1] / best[1]:.2f}x / {narrow[2] / best[2]:.2f}x PyTorch "
        "held to 128-bit vectors",
        ["trainer", "threads", "tokens / s", "ms / step", "vs PyTorch, same threads",
         "vs PyTorch held to 128-bit vectors"],
        rows,
        f"Median of {rounds} runs each, taken in turn. Both sides start from the same weights and train on the same "
        "batches (their loss drift is in benchmarks/results/drift.json). Node runs the builds the browser cell loads "
        "(a browser's engine is the same V8); Memory64 runs in wasmtime, which checks every 64-bit address. "
        f"PyTorch's code paths, by ATen's CPU capability: {', '.join(f'{k}: {v}' for k, v in capabilities.items())} "
        "(MKL and oneDNN capped alike). The matmuls are most of a training step. WebAssembly's SIMD is 128 bits "
        "wide, a quarter of AVX-512's and half of AVX2's; relaxed SIMD adds the fused multiply-add (f32x4."
        "relaxed_madd), which plain WASM SIMD lacks. What else closes the gap: the kernel packs A into panels so its "
        "inner loop does no address arithmetic, attention runs on the same kernel and skips the masked half, and "
        "exp and erf are SIMD polynomials.",
        out,
    )


def matmul(config, sizes: list[int], reps: int, out: Path) -> None:
    def wasm_seconds(build: str, threads: int) -> list[float]:
        answer = wasm.run(build, wasm.trainer_config(config), threads=threads, bench_gemm=(sizes, reps))
        bad = [g for g in answer["gemm"] if g["maxError"] != 0]
        assert not bad, f"the {build} gemm is wrong: {bad}"
        return [g["seconds"] for g in answer["gemm"]]

    def numpy_seconds(n: int, threads: int) -> float:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, "-c", NUMPY_GEMM, str(n), str(reps)], env=env, capture_output=True,
                              text=True, check=True)
        return json.loads(done.stdout)

    rows = []
    scalar = wasm_seconds("scalar", 1)
    for threads, plain, fused in ((1, "simd", "relaxed"), (2, "threads", "relaxed-threads")):
        simd, relaxed = wasm_seconds(plain, threads), wasm_seconds(fused, threads)
        for i, n in enumerate(sizes):
            flops, blas = 2 * n**3 / 1e9, numpy_seconds(n, threads)
            first = f"{flops / scalar[i]:.1f}" if threads == 1 else ""  # the scalar build has no threads
            rows.append([n, threads, first, f"{flops / simd[i]:.1f}", f"{flops / relaxed[i]:.1f}",
                         f"{flops / blas:.1f}", f"{blas / relaxed[i]:.2f}x"])
    write_result(
        "wasm_matmul",
        "The WASM trainer's matmul (n x n x n, fp32) beside numpy",
        ["n", "threads", "WASM scalar GFLOP/s", "WASM SIMD GFLOP/s", "WASM relaxed SIMD GFLOP/s", "numpy GFLOP/s",
         "WASM relaxed SIMD vs numpy"],
        rows,
        "The WASM kernel keeps a 4 x 8 block of C in eight 128-bit registers; the relaxed-SIMD build updates them with "
        "fused multiply-adds. numpy calls OpenBLAS, tuned for this CPU. Each WASM result is checked exactly on inputs "
        "whose products fp32 holds without rounding.",
        out,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and small products (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each contender; the table keeps the median")
    args = parser.parse_args(argv)
    config, _, ids, _ = oracle_setup()
    training(config, ids, 3 if args.quick else 60, 1 if args.quick else args.rounds, args.out)
    matmul(config, [64, 128] if args.quick else [128, 256, 512], 2 if args.quick else 10, args.out)


if __name__ == "__main__":
    main()
