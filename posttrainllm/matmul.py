"""Module 3: what a matrix multiply costs, and why tiling makes it fast.

``C = A @ B`` with A (M x K) and B (K x N) does M*N*K multiply-adds (2*M*N*K FLOPs), but the
time it takes is usually set by how many numbers travel from slow memory. The functions here
compute C the way a GPU kernel does — in tiles, and in register blocks — while *counting* the
loads, so the savings are measured rather than asserted. They are models for reading and
counting, not fast code: numpy's ``@`` (BLAS) is the fast path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from posttrainllm.measure import measure_seconds


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: one multiply and one add per term, ``2*m*n*k``."""
    return 2 * m * n * k


def matmul_min_bytes(m: int, n: int, k: int, itemsize: int = 4) -> int:
    """The least traffic any algorithm needs: read A and B once, write C once."""
    return itemsize * (m * k + k * n + m * n)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte of memory traffic: the x-axis of a roofline plot."""
    return flops / bytes_moved


def roofline(intensity: np.ndarray | float, peak_gflops: float, bandwidth_gbs: float) -> np.ndarray:
    """Attainable GFLOP/s: memory-bound ``bandwidth * intensity`` until it meets the compute peak."""
    return np.minimum(peak_gflops, bandwidth_gbs * np.asarray(intensity, dtype=float))


def matmul_naive(a: list[list[float]] | np.ndarray, b: list[list[float]] | np.ndarray) -> np.ndarray:
    """The textbook triple loop in pure Python: every term fetched one at a time."""
    a, b = np.asarray(a, dtype=float).tolist(), np.asarray(b, dtype=float).tolist()
    m, k, n = len(a), len(b), len(b[0])
    if len(a[0]) != k:
        raise ValueError(f"inner dimensions differ: A is {m}x{len(a[0])}, B is {k}x{n}")
    out = [[0.0] * n for _ in range(m)]
    for i in range(m):
        row, out_row = a[i], out[i]
        for p in range(k):
            a_ip, b_row = row[p], b[p]
            for j in range(n):
                out_row[j] += a_ip * b_row[j]
    return np.array(out)


@dataclass
class Traffic:
    """Numbers loaded from slow (global) memory and from fast (shared) memory by a model kernel."""

    slow_reads: int = 0
    fast_reads: int = 0


def _check_shapes(a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need 2-D A (m x k) and B (k x n), got shapes {a.shape} and {b.shape}")


def matmul_untiled(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, Traffic]:
    """One thread per output, no fast memory: each output reads a full row of A and column of B."""
    _check_shapes(a, b)
    (m, k), n = a.shape, b.shape[1]
    traffic = Traffic()
    out = np.zeros((m, n), dtype=np.result_type(a, b))
    for i in range(m):
        for j in range(n):
            traffic.slow_reads += 2 * k
            out[i, j] = a[i, :] @ b[:, j]
    return out, traffic


def matmul_tiled(a: np.ndarray, b: np.ndarray, tile: int = 16) -> tuple[np.ndarray, Traffic]:
    """Shared-memory tiling: a workgroup owns a ``tile x tile`` block of C and walks K in steps
    of ``tile``, loading one tile of A and one of B into fast memory per step.

    Every number loaded into a tile is reused ``tile`` times from fast memory, so slow-memory
    reads drop from ``2*m*n*k`` to about ``2*m*n*k / tile``. Edge tiles are clipped.
    """
    _check_shapes(a, b)
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    (m, k), n = a.shape, b.shape[1]
    traffic = Traffic()
    out = np.zeros((m, n), dtype=np.result_type(a, b))
    for i0 in range(0, m, tile):
        for j0 in range(0, n, tile):
            acc = np.zeros((min(tile, m - i0), min(tile, n - j0)), dtype=out.dtype)
            for p0 in range(0, k, tile):
                a_tile = a[i0 : i0 + tile, p0 : p0 + tile]  # load into fast memory
                b_tile = b[p0 : p0 + tile, j0 : j0 + tile]
                traffic.slow_reads += a_tile.size + b_tile.size
                # each output in the block reads its row of a_tile and column of b_tile
                traffic.fast_reads += acc.size * 2 * a_tile.shape[1]
                acc += a_tile @ b_tile
            out[i0 : i0 + tile, j0 : j0 + tile] = acc
    return out, traffic


def matmul_register_blocked(
    a: np.ndarray, b: np.ndarray, tile: int = 16, block: int = 4
) -> tuple[np.ndarray, Traffic]:
    """Tiling plus register blocking: each thread keeps a ``block x block`` patch of C in registers.

    Per step along K, a thread loads ``block`` values of A and ``block`` of B from fast memory
    and does ``block**2`` multiply-adds with them, so fast-memory reads drop by ``block`` too.
    Slow-memory traffic is the same as :func:`matmul_tiled`'s.
    """
    _check_shapes(a, b)
    if block < 1 or tile % block:
        raise ValueError(f"block must divide tile, got tile={tile}, block={block}")
    (m, k), n = a.shape, b.shape[1]
    traffic = Traffic()
    out = np.zeros((m, n), dtype=np.result_type(a, b))
    for i0 in range(0, m, tile):
        for j0 in range(0, n, tile):
            for p0 in range(0, k, tile):
                a_tile = a[i0 : i0 + tile, p0 : p0 + tile]
                b_tile = b[p0 : p0 + tile, j0 : j0 + tile]
                traffic.slow_reads += a_tile.size + b_tile.size
                depth = a_tile.shape[1]
                for r0 in range(0, a_tile.shape[0], block):  # one thread per register block
                    for c0 in range(0, b_tile.shape[1], block):
                        rows, cols = a_tile[r0 : r0 + block], b_tile[:, c0 : c0 + block]
                        traffic.fast_reads += depth * (rows.shape[0] + cols.shape[1])
                        out[i0 + r0 : i0 + r0 + block, j0 + c0 : j0 + c0 + block] += rows @ cols
    return out, traffic


def tiled_slow_reads(m: int, n: int, k: int, tile: int) -> int:
    """The closed form of :func:`matmul_tiled`'s slow reads, edges included.

    Every A element is loaded once per column of tiles, every B element once per row of tiles:
    ``m*k*ceil(n/tile) + k*n*ceil(m/tile)``, which is ``2*m*n*k/tile`` when tile divides m and n.
    """
    return m * k * math.ceil(n / tile) + k * n * math.ceil(m / tile)


def measure_bandwidth_gbs(n_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Memory bandwidth seen by numpy: copy ``n_bytes`` (each byte read once and written once)."""
    src = np.ones(n_bytes // 8)
    dst = np.empty_like(src)
    seconds = measure_seconds(lambda: np.copyto(dst, src), repeats)
    return 2 * src.nbytes / seconds / 1e9


def measure_matmul_gflops(n: int, dtype=np.float32, repeats: int = 5, seed: int = 0) -> float:
    """GFLOP/s of numpy's ``@`` on two random ``n x n`` matrices."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, n)).astype(dtype), rng.standard_normal((n, n)).astype(dtype)
    return matmul_flops(n, n, n) / measure_seconds(lambda: a @ b, repeats) / 1e9


@dataclass(frozen=True)
class RooflineOp:
    """An operation to place on the roofline: its FLOPs, the fewest bytes it must move, and a call."""

    flops: int
    min_bytes: int
    run: Callable[[], object]

    @property
    def intensity(self) -> float:
        return arithmetic_intensity(self.flops, self.min_bytes)

    def measure_gflops(self, repeats: int = 5) -> float:
        return self.flops / measure_seconds(self.run, repeats) / 1e9


def roofline_operations(seed: int = 0, n_vec: int = 2**22, n_mv: int = 8192,
                        matmul_sizes: tuple[int, ...] = (32, 128, 512, 1024)) -> dict[str, RooflineOp]:
    """Module 3's operations, from 1/12 FLOP per byte to a large matmul, on random float32 data.

    The defaults make the matrix-vector product's matrix 256 MiB: larger than a laptop's last-level
    cache, so there it streams from main memory as the roofline assumes. A server CPU's cache can
    hold it (the book's machine's does; module 3 shows what that does to the roofline).
    """
    rng = np.random.default_rng(seed)
    u, w = rng.standard_normal(n_vec, dtype=np.float32), rng.standard_normal(n_vec, dtype=np.float32)
    mat, vec = rng.standard_normal((n_mv, n_mv), dtype=np.float32), rng.standard_normal(n_mv, dtype=np.float32)
    ops = {
        "vector add": RooflineOp(n_vec, 12 * n_vec, lambda: u + w),
        "dot product": RooflineOp(2 * n_vec, 8 * n_vec, lambda: u @ w),
        "matrix-vector": RooflineOp(2 * n_mv**2, 4 * (n_mv**2 + 2 * n_mv), lambda: mat @ vec),
    }
    for n in matmul_sizes:
        a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
        ops[f"matmul {n}"] = RooflineOp(matmul_flops(n, n, n), matmul_min_bytes(n, n, n), lambda a=a, b=b: a @ b)
    return ops
