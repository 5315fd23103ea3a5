"""The WASM trainer beside the PyTorch oracle on the CPU: training tokens/s and matmul GFLOP/s.

- Training: module 7's GPT, batch 16 x 64, the same steps on the same batches, in each WASM
  build under node (scalar, SIMD, SIMD + threads on 1 and 2 threads), the Memory64 build in
  wasmtime, and in PyTorch on 1 and 2 threads. The goal: the threaded SIMD trainer at least
  half of PyTorch's tokens/s on 2 threads.
- Matmul: the trainer's own gemm (``tg_bench_gemm``) on n x n x n products, beside numpy's
  (OpenBLAS) on the same thread counts.

    python benchmarks/wasm.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import wasm  # noqa: E402
from posttrainllm.model import oracle_setup  # noqa: E402

CONTENDERS = [("scalar", 1), ("simd", 1), ("threads", 1), ("threads", 2), ("memory64", 1)]
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


def torch_seconds(config, ids, steps: int, threads: int) -> float:
    torch.set_num_threads(threads)
    model = wasm.oracle_at_init(config)
    wasm.oracle_losses(model, ids, 2, wasm.BATCH)  # warm-up
    start = time.perf_counter()
    wasm.oracle_losses(model, ids, steps, wasm.BATCH)
    return time.perf_counter() - start


def training(config, ids, steps: int, out: Path) -> None:
    tokens = steps * wasm.BATCH * config.block_size
    runs = [("PyTorch", t, torch_seconds(config, ids, steps, t)) for t in (1, 2)]
    for build, threads in CONTENDERS:
        answer = wasm.run(build, wasm.trainer_config(config), threads=threads, tokens=ids, steps=steps)
        runs.append((f"WASM {build}" + (" (wasmtime)" if build == "memory64" else ""), threads, answer["seconds"]))
    torch_at = {threads: s for name, threads, s in runs if name == "PyTorch"}
    rows = [[name, threads, f"{tokens / s:,.0f}", f"{s / steps * 1e3:.1f}", f"{torch_at[threads] / s:.2f}x"]
            for name, threads, s in runs]
    ratio = torch_at[2] / next(s for name, threads, s in runs if name == "WASM threads" and threads == 2)
    write_result(
        "wasm_training",
        f"Training module 7's GPT ({steps} steps, batch {wasm.BATCH} x {config.block_size}): WASM under node beside "
        f"PyTorch; threaded SIMD at {ratio:.2f}x PyTorch on 2 threads (goal: 0.5x)",
        ["trainer", "threads", "tokens / s", "ms / step", "vs PyTorch, same threads"],
        rows,
        "Both sides start from the same weights and train on the same batches (their loss drift is in "
        "benchmarks/results/drift.json). Node runs the builds the browser cell loads; a browser's engine is the same "
        "V8; Memory64 runs in wasmtime, which checks every 64-bit address. The matmuls are most of a training step, "
        "and PyTorch's run on kernels written for this CPU's 512-bit vectors with fused multiply-add; WASM SIMD is "
        "128 bits wide and has no fused multiply-add, so its matmul runs at a fraction of their speed (the matmul "
        "table). What closes part of the gap: the WASM kernel packs A into panels so its inner loop does no "
        "address arithmetic, attention runs on the same kernel, and exp and erf are SIMD polynomials.",
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
    for threads, build in ((1, "simd"), (2, "threads")):
        simd = wasm_seconds(build, threads)
        for i, n in enumerate(sizes):
            flops, blas = 2 * n**3 / 1e9, numpy_seconds(n, threads)
            plain = f"{flops / scalar[i]:.1f}" if threads == 1 else ""  # the scalar build has no threads
            rows.append([n, threads, plain, f"{flops / simd[i]:.1f}", f"{flops / blas:.1f}", f"{blas / simd[i]:.2f}x"])
    write_result(
        "wasm_matmul",
        "The WASM trainer's matmul (n x n x n, fp32) beside numpy",
        ["n", "threads", "WASM scalar GFLOP/s", "WASM SIMD GFLOP/s", "numpy GFLOP/s", "WASM SIMD vs numpy"],
        rows,
        "The WASM kernel keeps a 4 x 8 block of C in eight 128-bit registers; numpy calls OpenBLAS, tuned for this "
        "CPU. Each WASM result is checked exactly on inputs whose products fp32 holds without rounding.",
        out,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and small products (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config, _, ids, _ = oracle_setup()
    training(config, ids, 3 if args.quick else 60, args.out)
    matmul(config, [64, 128] if args.quick else [128, 256, 512], 2 if args.quick else 10, args.out)


if __name__ == "__main__":
    main()
