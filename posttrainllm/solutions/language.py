"""Module 5's exercises, answered: the bigram table from counts, the nucleus (top-p)
distribution, and the temperature that gives a distribution a chosen entropy."""

from __future__ import annotations

import numpy as np

from posttrainllm.sampling import next_token_distribution

__all__ = ["bigram_probs", "temperature_for_bits", "top_p_distribution"]


def bigram_probs(ids: np.ndarray, vocab_size: int, alpha: float) -> np.ndarray:
    """``P[a, b]``: the probability that ``b`` follows ``a``, from the pair counts plus ``alpha``."""
    counts = np.full((vocab_size, vocab_size), float(alpha))
    np.add.at(counts, (ids[:-1], ids[1:]), 1)
    return counts / counts.sum(axis=1, keepdims=True)


def top_p_distribution(probs: np.ndarray, p: float) -> np.ndarray:
    """The most likely tokens, in order (ties to the lower id), until their mass reaches ``p``;
    the rest zeroed; renormalised."""
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(probs.shape, dtype=bool)
    keep[order[mass_before < p - 1e-12]] = True
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum()


def temperature_for_bits(logits: np.ndarray, bits: float) -> float:
    """The temperature at which ``softmax(logits / T)`` has an entropy of ``bits``, by bisection on
    a log scale (the entropy rises with the temperature)."""
    def entropy_bits(t: float) -> float:
        q = next_token_distribution(logits, temperature=t)
        q = q[q > 0]
        return float(-(q * np.log2(q)).sum())

    low, high = 0.01, 100.0
    for _ in range(60):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if entropy_bits(middle) < bits else (low, middle)
    return low
