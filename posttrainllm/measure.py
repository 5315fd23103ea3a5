"""Measuring code the same way everywhere: the best wall-clock time of a few runs, and the peak
memory a call allocates beyond what it returns. Used by notebooks and ``benchmarks/``."""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable

import numpy as np


def best_of(fn: Callable[[], object], repeats: int = 5) -> tuple[float, object]:
    """``(best seconds, last result)`` over ``repeats`` runs; the best is the least disturbed by other work."""
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def measure_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """The best of ``repeats`` wall-clock runs of ``fn``."""
    return best_of(fn, repeats)[0]


def extra_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes ``fn`` allocates (``tracemalloc`` sees numpy's buffers) minus the arrays it returns:
    the working memory an algorithm needs beyond its output."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    outputs = result if isinstance(result, tuple) else (result,)
    return peak - sum(np.asarray(r).nbytes for r in outputs)


def agreement(error: float, tolerance: float) -> str:
    """How a round-off error reads in print: ``"within 1e-12"`` while it is below ``tolerance``, the
    error itself once it is not. The digits of a round-off error depend on the order in which the
    CPU adds (its vector width, its thread count); whether it is below a bound does not."""
    return f"within {tolerance:.0e}" if error < tolerance else f"{error:.1e}, above {tolerance:.0e}"
