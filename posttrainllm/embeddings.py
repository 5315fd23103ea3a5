"""Module 6: what an embedding table holds, and how to read it.

An embedding is a lookup table: row ``i`` is the vector for token ``i``, trained like any
other weight. Tokens used in similar contexts end up with similar rows, which we read off by
cosine similarity. Position embeddings tell an order-blind model where each token sits.
"""

from __future__ import annotations

import numpy as np


def cosine_similarity(table: np.ndarray) -> np.ndarray:
    """All pairwise cosine similarities between the rows of ``table``."""
    table = np.asarray(table, dtype=np.float64)
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


def nearest_neighbours(
    table: np.ndarray, query: int, k: int = 5, candidates: np.ndarray | None = None
) -> list[tuple[int, float]]:
    """The ``k`` rows most similar to row ``query`` (itself excluded), with their similarity.

    ``candidates`` (row ids) restricts the search, e.g. to tokens seen in training: rows that
    were never trained keep their random initial values and are noise.
    """
    if not 0 <= query < len(table):
        raise ValueError(f"query row {query} is outside a table of {len(table)} rows")
    sims = cosine_similarity(table)[query]
    if candidates is not None:
        allowed = np.zeros(len(table), dtype=bool)
        allowed[np.asarray(candidates)] = True
        sims = np.where(allowed, sims, -np.inf)
    sims[query] = -np.inf
    order = np.argsort(-sims, kind="stable")[:k]
    return [(int(i), float(sims[i])) for i in order]


def sinusoidal_positions(n_positions: int, dim: int) -> np.ndarray:
    """The fixed position encoding of "Attention Is All You Need": sines and cosines whose
    wavelengths grow geometrically from 2*pi to 10000*2*pi across the dimensions."""
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    positions = np.arange(n_positions)[:, None]
    freqs = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
    table = np.zeros((n_positions, dim))
    table[:, 0::2] = np.sin(positions * freqs)
    table[:, 1::2] = np.cos(positions * freqs)
    return table
