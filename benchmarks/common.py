"""Shared plumbing for the benchmarks: the machine description and writing a result file.

Each benchmark measures its contenders side by side in one run (this machine is shared and
noisy, so only ratios within one run mean much) and writes ``results/<name>.json``, which the
book's benchmarks page renders as a table.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import re
import subprocess
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's name as the OS reports it (Linux's /proc/cpuinfo, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def instruction_set() -> str:
    """The vector instruction set PyTorch's CPU kernels dispatch to here (AVX512, AVX2, DEFAULT, ...),
    which ``ATEN_CPU_CAPABILITY`` can lower: the same CPU gives different figures under each."""
    try:
        import torch
    except ImportError:
        return "unknown (no PyTorch)"
    return torch.backends.cpu.get_cpu_capability()


SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
# macOS publishes cache sizes through sysctl, not sysfs: an Intel Mac has an L3; Apple silicon's
# last level it reports is the performance cores' L2 (its system-level cache is not published)
DARWIN_CACHE_KEYS = ("hw.l3cachesize", "hw.perflevel0.l2cachesize", "hw.l2cachesize")


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of the CPU's last-level cache, from Linux's sysfs or macOS's sysctl (None where
    neither publishes it)."""
    caches = []
    for index in sysfs.glob("index*"):
        try:
            level, size = (index / "level").read_text().strip(), (index / "size").read_text().strip()
        except OSError:
            continue
        unit = SIZE_UNITS.get(size[-1])
        caches.append((int(level), int(size[:-1]) * unit if unit else int(size)))
    if caches:
        return max(caches)[1]
    return _darwin_cache_bytes() if platform.system() == "Darwin" else None


def _darwin_cache_bytes() -> int | None:
    for key in DARWIN_CACHE_KEYS:
        found = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, check=False).stdout.strip()
        if found.isdigit() and int(found) > 0:
            return int(found)
    return None


def machine() -> str:
    return (
        f"{platform.machine()}, {cpu_model()}, {instruction_set()} kernels, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )


def write_result(name: str, title: str, columns: list[str], rows: list[list], notes: str, out_dir: Path = RESULTS,
                 data: dict | None = None):
    """Save one benchmark's table, and under ``data`` any unrounded figures a notebook plots;
    returns the path written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    payload = {"title": title, "machine": machine(), "columns": columns, "rows": rows, "notes": notes}
    if data is not None:
        payload["data"] = data
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    return path


PEAK_BF16 = {"H100": 989e12, "H200": 989e12}  # dense bf16 FLOP/s of the SXM parts (NVIDIA's data sheets halved:
# they quote 1,979 TFLOP/s with 2:4 sparsity)


def result_suffix(tag: str | None, gpu: str) -> str:
    """``_<tag>`` for a GPU result file's name. Untagged names hold the H200's tables (the GPU the
    issues name), so with no ``--tag`` a run on any other GPU is named after its model
    (``NVIDIA H100 80GB HBM3`` -> ``_h100``) and cannot overwrite them."""
    if tag is None:
        model = re.search(r"\b[A-Z]+\d+\w*", gpu)
        tag = "" if "H200" in gpu else (model.group() if model else re.sub(r"\W+", "_", gpu).strip("_")).lower()
    return f"_{tag}" if tag else ""


def peak_bf16(gpu: str) -> float | None:
    """The dense bf16 peak of a GPU named like ``torch.cuda.get_device_name()``, if known."""
    return next((v for k, v in PEAK_BF16.items() if k in gpu), None)


def gpt_flops_per_token(n_params: int, config) -> float:
    """Training FLOPs per token, PaLM's count (Chowdhery et al., 2022, appendix B): ``6 N`` for the
    weights plus ``12 L d T`` for the attention scores, counted in full though causal kernels skip half."""
    return 6 * n_params + 12 * config.n_layer * config.n_embd * config.block_size


def alone(fn, *args):
    """``fn(*args)`` in a fresh process: its own device (or CUDA context), and nothing left behind."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def nvidia_driver() -> str:
    """The NVIDIA driver's version as ``nvidia-smi`` reports it, or ``"unknown"``."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
