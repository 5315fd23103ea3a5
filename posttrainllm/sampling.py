"""Turning a model's logits into the next token: greedy, temperature, top-k and top-p.

Every sampler here is two steps, kept apart so each can be tested on its own:
:func:`next_token_distribution` reshapes the logits into the exact distribution that will be
sampled (temperature first, then top-k, then top-p, then renormalise), and :func:`sample`
draws from it with a seeded generator.
"""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities from logits, shifted by the max so ``exp`` cannot overflow."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def next_token_distribution(
    logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """The renormalised distribution a sampler with these settings draws from.

    - ``temperature`` divides the logits: below 1 sharpens, above 1 flattens, 0 means greedy
      (all mass on the arg-max; ties go to the lowest id).
    - ``top_k`` keeps the k most likely tokens (ties at the boundary: the lower ids win).
    - ``top_p`` keeps the smallest set of most likely tokens whose mass reaches ``top_p``.

    >>> next_token_distribution(np.log([0.5, 0.3, 0.2]), top_k=2).round(3).tolist()
    [0.625, 0.375, 0.0]
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
    if not np.isfinite(logits).all():
        raise ValueError("logits contain NaN or infinity")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and not 1 <= top_k <= logits.size:
        raise ValueError(f"top_k must be between 1 and the vocabulary size {logits.size}, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        probs = np.zeros_like(logits)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    probs = softmax(logits / temperature)
    order = np.argsort(-probs, kind="stable")  # most likely first; equal ones by id
    keep = np.ones(logits.size, dtype=bool)
    if top_k is not None:
        keep[order[top_k:]] = False
    if top_p is not None:
        ranked = probs[order] * keep[order]
        cumulative = np.cumsum(ranked)
        # keep a token if the mass before it has not yet reached top_p
        cut = np.searchsorted(cumulative, top_p * cumulative[-1] - 1e-12) + 1
        keep[order[cut:]] = False
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


def sample(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | None = None,
) -> int:
    """One token id drawn from :func:`next_token_distribution` (greedy when temperature is 0)."""
    probs = next_token_distribution(logits, temperature, top_k, top_p)
    rng = rng or np.random.default_rng()
    return int(rng.choice(probs.size, p=probs))


def greedy(logits: np.ndarray) -> int:
    """The most likely token (temperature 0)."""
    return sample(logits, temperature=0.0)


# --- checking a sampler: do its draws follow the distribution it claims? ----------------------


def _upper_regularized_gamma(s: float, x: float) -> float:
    """Q(s, x) = Gamma(s, x) / Gamma(s): a series below x < s + 1, a continued fraction above."""
    import math

    if x <= 0:
        return 1.0
    log_prefactor = s * math.log(x) - x - math.lgamma(s)
    if x < s + 1:
        term = total = 1.0 / s
        k = s
        while abs(term) > abs(total) * 1e-15:
            k += 1
            term *= x / k
            total += term
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    b, c, d = x + 1 - s, 1e300, 1.0 / (x + 1 - s)
    h = d
    for i in range(1, 10_000):  # Lentz's method
        an = -i * (i - s)
        b += 2
        d = 1.0 / (an * d + b)
        c = b + an / c
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(log_prefactor)


def chi_square_test(draws: np.ndarray, probs: np.ndarray) -> tuple[float, int, float]:
    """Pearson's goodness-of-fit test of integer ``draws`` against ``probs``.

    Returns ``(statistic, degrees of freedom, p-value)``. Tokens with probability 0 must never be
    drawn (any such draw gives p = 0); the others are compared by expected vs observed counts.
    """
    probs = np.asarray(probs, dtype=np.float64)
    counts = np.bincount(np.asarray(draws), minlength=probs.size)
    if counts.size > probs.size or counts[probs == 0].any():
        return float("inf"), int((probs > 0).sum() - 1), 0.0
    support = probs > 0
    expected = probs[support] * counts.sum()
    statistic = float(np.sum((counts[support] - expected) ** 2 / expected))
    dof = int(support.sum() - 1)
    return statistic, dof, (_upper_regularized_gamma(dof / 2, statistic / 2) if dof > 0 else 1.0)
