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
- Profile: where the relaxed build's training step spends its time, by V8's sampling profiler
  (``node --cpu-prof``) over a build that keeps its function names (``build.sh OUT --names``).

    python benchmarks/wasm.py [--quick] [--rounds N] [--tables training matmul profile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


TABLES = ["training", "matmul", "profile"]
# kernels.h's matrix-product functions: a profile names those that clang left as functions of their own
PRODUCT = ("kernels::rows4", "kernels::gemm", "kernels::block4x8", "kernels::column4", "kernels::pack4")


def short_name(function: str) -> str:
    """A C++ function's name as the profiler reports it, without its arguments and anonymous namespace."""
    function = function.replace("(anonymous namespace)::", "")
    return function.split("(")[0] if function.endswith(")") else function


def step_shares(cpuprofile: dict) -> dict[str, float]:
    """Each function's share of the samples taken inside ``tg_step`` (its self time), largest first."""
    nodes = {node["id"]: node for node in cpuprofile["nodes"]}
    parent = {child: node["id"] for node in cpuprofile["nodes"] for child in node.get("children", ())}

    def in_step(node_id: int) -> bool:
        while node_id is not None:
            if nodes[node_id]["callFrame"]["functionName"] == "tg_step":
                return True
            node_id = parent.get(node_id)
        return False

    counts: dict[str, int] = {}
    for node_id in cpuprofile["samples"]:
        if in_step(node_id):
            name = short_name(nodes[node_id]["callFrame"]["functionName"])
            counts[name] = counts.get(name, 0) + 1
    total = sum(counts.values())
    return {name: n / total for name, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def profile(config, ids, steps: int, out: Path) -> None:
    """The relaxed build's ``steps`` training steps under node's sampling profiler, by function."""
    with tempfile.TemporaryDirectory(prefix="tinygpt-profile-") as tmp:
        tmp = Path(tmp)
        subprocess.run(["bash", str(wasm.WASM / "build.sh"), str(tmp / "dist"), "--names"], check=True,
                       capture_output=True, env={**os.environ, "PYTHON": sys.executable})
        wasm.run("relaxed", wasm.trainer_config(config), tokens=ids, steps=steps, dist=tmp / "dist",
                 node_flags=("--cpu-prof", f"--cpu-prof-dir={tmp / 'profile'}", "--cpu-prof-interval=100"))
        (found,) = (tmp / "profile").glob("*.cpuprofile")
        shares = step_shares(json.loads(found.read_text()))
    kernel = sum(share for name, share in shares.items() if name in PRODUCT)
    top = list(shares.items())[:8]
    rows = [[name, "yes" if name in PRODUCT else "", f"{100 * share:.1f}%"] for name, share in top]
    rows.append(["everything else", "", f"{100 * (1 - sum(share for _, share in top)):.1f}%"])
    write_result(
        "wasm_profile",
        f"Where the relaxed WASM build's training step spends its time ({steps} steps, 1 thread, node's sampling "
        f"profiler): {100 * kernel:.0f}% in the matrix-product kernel",
        ["function", "part of the matrix-product kernel", "share of the step's samples"],
        rows,
        "Self time: a sample counts for the function running when it was taken, among the samples taken inside "
        "tg_step (one training step: forward, backward, AdamW). A sample every 0.1 ms. clang inlines small "
        "functions into their callers, so forward and backward hold what was inlined into them: the embeddings, "
        "layer norms, softmaxes, GELU and the loss, and their gradients. The build is the relaxed one with its "
        "function names kept (build.sh OUT --names), the same code as the committed, stripped build.",
        out,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and small products (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each contender; the table keeps the median")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=TABLES, help="which tables to measure")
    args = parser.parse_args(argv)
    config, _, ids, _ = oracle_setup()
    if "training" in args.tables:
        training(config, ids, 3 if args.quick else 60, 1 if args.quick else args.rounds, args.out)
    if "matmul" in args.tables:
        matmul(config, [64, 128] if args.quick else [128, 256, 512], 2 if args.quick else 10, args.out)
    if "profile" in args.tables:
        profile(config, ids, 3 if args.quick else 60, args.out)


if __name__ == "__main__":
    main()
