"""The roofline of a device, measured: peak matmul FLOP/s (fp32 with TF32 off, TF32 and bf16 on CUDA;
fp32 on the CPU) and read bandwidth, with the ridge point each gives. The inference and serving
chapter reads the CUDA table (``roofline_gpu.json``, measured on an H200) and measures the CPU's
own roof when the book is built. On the CPU it also places module 3's operations on numpy's
roofline (``roofline_operations_cpu.json``), the figure module 3 draws.

    python benchmarks/roofline.py [--device cuda] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, last_level_cache_bytes, write_result  # noqa: E402

from posttrainllm import matmul, roofline  # noqa: E402


def _median(fn, runs: int) -> float:
    return statistics.median(fn() for _ in range(runs))


def operations(runs: int, quick: bool, out: Path) -> None:
    """Module 3's roofline with numpy: bandwidth from a copy, then each operation's attained GFLOP/s
    (medians of ``runs``, each the best of 5 calls) beside the roof at its intensity. The peak P is
    the fastest matmul among them, as module 3 takes it."""
    copy_bytes = 4 * 2**20 if quick else 64 * 2**20
    bandwidth = _median(lambda: matmul.measure_bandwidth_gbs(copy_bytes), runs)
    sizes = dict(n_vec=2**16, n_mv=512, matmul_sizes=(32, 128)) if quick else {}
    ops = matmul.roofline_operations(**sizes)
    attained = {name: {"intensity": op.intensity, "min_bytes": op.min_bytes, "gflops": _median(op.measure_gflops, runs)}
                for name, op in ops.items()}
    peak = max(a["gflops"] for name, a in attained.items() if name.startswith("matmul"))
    rows = []
    for name, a in attained.items():
        roof = float(matmul.roofline(a["intensity"], peak, bandwidth))
        rows.append([name, f"{a['intensity']:.2f}", f"{a['gflops']:,.1f}", f"{roof:,.1f}", f"{a['gflops'] / roof:.0%}"])
    cache = last_level_cache_bytes()
    notes = (f"numpy float32 with its BLAS's default threads, last-level cache "
             f"{f'{cache >> 20} MiB' if cache else 'unknown'}; W = {bandwidth:,.1f} GB/s (a copy of "
             f"{copy_bytes >> 20} MiB), P = {peak:,.1f} GFLOP/s (the fastest matmul here), ridge "
             f"{peak / bandwidth:,.1f} FLOP/byte; medians of {runs} runs, each the best of 5 calls; measured "
             f"{datetime.date.today().isoformat()}. Module 3 plots this table.")
    write_result("roofline_operations_cpu", "Module 3's operations on the CPU roofline (numpy)",
                 ["operation", "FLOP/byte", "GFLOP/s", "roof min(P, W·I)", "of the roof"], rows, notes, out,
                 data={"bandwidth_gbs": bandwidth, "peak_gflops": peak, "last_level_cache_bytes": cache,
                       "operations": attained})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes: the code path, not the numbers")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    n, mib, runs = (256, 16, 1) if args.quick else ((8192, 4096, 5) if cuda else (2048, 1024, 5))
    precisions = [("fp32", torch.float32, False)]
    if cuda:
        precisions += [("tf32", torch.float32, True), ("bf16", torch.bfloat16, False)]
    bandwidth = _median(lambda: roofline.read_bandwidth(mib, args.device), runs)
    rows = [["read bandwidth", f"{bandwidth / 1e9:,.0f} GB/s", "-"]]
    for name, dtype, tf32 in precisions:
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        flops = _median(lambda dtype=dtype: roofline.matmul_rate(n, dtype, args.device), runs)
        rows.append([f"{name} matmul, n = {n}", f"{flops / 1e12:,.2f} TFLOP/s", f"{flops / bandwidth:,.0f}"])
    if cuda:
        props = torch.cuda.get_device_properties(0)
        smi = shutil.which("nvidia-smi")
        driver = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                text=True).stdout.split("\n")[0] if smi else "unknown"
        where = f"{props.name}, driver {driver}, CUDA {torch.version.cuda}, torch {torch.__version__}"
        name = "roofline_gpu"
    else:
        where, name = f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}", "roofline_cpu"
    notes = (f"{where}; medians of {runs} runs, each the best of 5 timed calls; bandwidth from summing {mib} MiB "
             f"of float32; measured {datetime.date.today().isoformat()}.")
    write_result(name, f"Measured roofline ({where.split(',')[0]})", ["quantity", "value", "ridge (FLOP/byte)"],
                 rows, notes, args.out)
    if not cuda:
        operations(runs, args.quick, args.out)


if __name__ == "__main__":
    main()
