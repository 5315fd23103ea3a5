"""The roofline model: what limits a kernel, arithmetic or memory (the inference and serving
chapter, ``book/inference-serving.md``; Williams, Waterman and Patterson, *Roofline: An
Insightful Visual Performance Model for Multicore Architectures*, CACM 2009).

A kernel that does ``F`` floating-point operations while moving ``B`` bytes to and from main
memory has arithmetic intensity ``I = F / B``. On a machine with peak ``P`` FLOP/s and memory
bandwidth ``W`` bytes/s it can reach at most ``min(P, I * W)``. Below the *ridge point*
``I = P / W`` a kernel is memory-bound: faster arithmetic would not help, fewer bytes would.
Decoding one token at batch 1 multiplies every weight matrix by a vector, about 2 FLOPs per
weight read; that is why it is memory-bound, and why quantized weights make it faster.

The peak and the bandwidth here are *measured* (a large matmul, a large copy), on the CPU or on
a CUDA device, so the roof is this machine's, not a datasheet's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Roof:
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) at which memory stops being the limit."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops, intensity * self.bandwidth)


def matmul_intensity(m: int, n: int, k: int, bytes_per_value: int) -> float:
    """FLOP per byte of ``(m, k) @ (k, n)`` when each operand is read once and the result written once."""
    return 2 * m * n * k / (bytes_per_value * (m * k + k * n + m * n))


def _seconds(fn, repeats: int, device: str) -> float:
    """The fastest of ``repeats`` timed calls after one warm-up (CUDA: synchronised around each call)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(n: int, dtype: torch.dtype = torch.float32, device: str = "cpu", repeats: int = 5) -> float:
    """Measured FLOP/s of an ``n x n`` matmul (``2 n^3`` operations)."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    return 2 * n**3 / _seconds(lambda: a @ b, repeats, device)


def read_bandwidth(mib: int = 1024, device: str = "cpu", repeats: int = 5) -> float:
    """Measured bytes/s of summing ``mib`` MiB of float32: every byte read once, almost no arithmetic,
    as a decode step reads its weights. The default 1 GiB is larger than any CPU's last-level cache
    (this build machine's is 480 MiB), so the reads come from main memory."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    return src.numel() * 4 / _seconds(lambda: src.sum(), repeats, device)


def measure(device: str = "cpu", n: int = 2048, dtype: torch.dtype = torch.float32) -> Roof:
    return Roof(matmul_flops(n, dtype, device), read_bandwidth(device=device))
