"""The roofline model: what limits a kernel, arithmetic or memory (the inference and serving
chapter, ``book/inference-serving.md``; Williams, Waterman and Patterson, *Roofline: An
Insightful Visual Performance Model for Multicore Architectures*, CACM 2009).

A kernel that does ``F`` floating-point operations while moving ``B`` bytes to and from main
memory has arithmetic intensity ``I = F / B``. On a machine with peak ``P`` FLOP/s and memory
bandwidth ``W`` bytes/s it can reach at most ``min(P, I * W)``. Below the *ridge point*
``I = P / W`` a kernel is memory-bound: faster arithmetic would not help, fewer bytes would.
Decoding one token at batch 1 multiplies every weight matrix by a vector, about 2 FLOPs per
weight read; that is why it is memory-bound, and why quantized weights make it faster.

Module 3 (:mod:`posttrainllm.matmul`) counts a matmul's FLOPs and bytes and draws the roofline
for numpy on the CPU; this module measures the roof with PyTorch on any device (a large matmul,
a large read, CUDA synchronised), so the roof is this machine's or the GPU's, not a datasheet's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrainllm import matmul
from posttrainllm.measure import measure_seconds


@dataclass(frozen=True)
class Roof:
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) at which memory stops being the limit."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """FLOP/s, by module 3's :func:`posttrainllm.matmul.roofline` (which works in GFLOP/s and GB/s)."""
        return float(matmul.roofline(intensity, self.peak_flops / 1e9, self.bandwidth / 1e9)) * 1e9


def _seconds(fn, repeats: int, device: str) -> float:
    """The fastest of ``repeats`` timed calls after one warm-up; on CUDA each call ends with a
    synchronise, so the time is the GPU's and the next call starts on an idle device."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    return measure_seconds(lambda: (fn(), sync()), repeats)


def matmul_rate(n: int, dtype: torch.dtype = torch.float32, device: str = "cpu", repeats: int = 5) -> float:
    """Measured FLOP/s of an ``n x n`` PyTorch matmul on ``device``."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    return matmul.matmul_flops(n, n, n) / _seconds(lambda: a @ b, repeats, device)


def read_bandwidth(mib: int = 1024, device: str = "cpu", repeats: int = 5) -> float:
    """Measured bytes/s of summing ``mib`` MiB of float32: every byte read once, almost no arithmetic,
    as a decode step reads its weights. The default 1 GiB is larger than the last-level cache one
    core can read (the machines that built this book had 300 and 480 MiB; the largest server parts
    total more, split among chiplets that each cache their own cores' data), so the reads come
    from main memory. (Module 3's
    :func:`posttrainllm.matmul.measure_bandwidth_gbs` copies 64 MiB with numpy, on the CPU only.)"""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    return src.numel() * 4 / _seconds(lambda: src.sum(), repeats, device)


def measure(device: str = "cpu", n: int = 2048, dtype: torch.dtype = torch.float32) -> Roof:
    return Roof(matmul_rate(n, dtype, device), read_bandwidth(device=device))
