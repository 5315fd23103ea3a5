"""Module 3's exercises, answered: the shape broadcasting gives, the loads a tiled matmul makes,
and the smallest tile within a budget of loads."""

from __future__ import annotations

from posttrainllm.matmul import tiled_slow_reads as tiled_reads

__all__ = ["broadcast_shape", "smallest_tile", "tiled_reads"]


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``x + y`` for arrays of shapes ``a`` and ``b``, by NumPy's rule: align on the
    right, and each pair of sizes must be equal or contain a 1."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    if any(i != j and 1 not in (i, j) for i, j in zip(a, b, strict=True)):
        raise ValueError(f"shapes {a} and {b} do not broadcast")
    return tuple(max(i, j) for i, j in zip(a, b, strict=True))


def smallest_tile(m: int, n: int, k: int, budget: int) -> int:
    """The smallest tile whose ``m x k @ k x n`` matmul loads at most ``budget`` numbers."""
    return next(t for t in range(1, max(m, n, k) + 1) if tiled_reads(m, n, k, t) <= budget)
