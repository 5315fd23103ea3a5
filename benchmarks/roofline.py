"""The roofline of a device, measured: peak matmul FLOP/s (fp32 with TF32 off, TF32 and bf16 on CUDA;
fp32 on the CPU) and read bandwidth, with the ridge point each gives. The inference and serving
chapter reads the CUDA table (``roofline_gpu.json``, measured on an H200) and measures the CPU's
own roof when the book is built.

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
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import roofline  # noqa: E402


def _median(fn, runs: int) -> float:
    return statistics.median(fn() for _ in range(runs))


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


if __name__ == "__main__":
    main()
