"""Module 5: the count-based bigram language model — next-token prediction with no learning at all.

Count how often each token follows each other token, normalise each row into a distribution,
and that table *is* a language model: ``P(next | current)``. Add-``alpha`` smoothing gives
unseen pairs a little mass, so no held-out text gets probability zero (infinite loss).
"""

from __future__ import annotations

import numpy as np

from posttrainllm.sampling import sample


class BigramLM:
    def __init__(self, vocab_size: int, alpha: float = 1.0) -> None:
        if alpha < 0:
            raise ValueError(f"smoothing alpha must be >= 0, got {alpha}")
        self.vocab_size = vocab_size
        self.alpha = alpha
        self.counts = np.zeros((vocab_size, vocab_size), dtype=np.int64)

    def fit(self, ids: np.ndarray) -> BigramLM:
        ids = np.asarray(ids)
        np.add.at(self.counts, (ids[:-1], ids[1:]), 1)
        return self

    @property
    def probs(self) -> np.ndarray:
        smoothed = self.counts + self.alpha
        totals = smoothed.sum(axis=1, keepdims=True)
        # a row never seen and unsmoothed has no information: make it uniform rather than 0/0
        return np.divide(smoothed, totals, out=np.full(smoothed.shape, 1 / self.vocab_size), where=totals > 0)

    def nll(self, ids: np.ndarray) -> float:
        """Mean negative log-likelihood (nats per token) of each token given the one before."""
        ids = np.asarray(ids)
        p = self.probs[ids[:-1], ids[1:]]
        return float(-np.mean(np.log(p)))

    def generate(self, start: int, length: int, rng: np.random.Generator, temperature: float = 1.0) -> list[int]:
        out = [start]
        logp = np.log(np.maximum(self.probs, 1e-300))
        for _ in range(length):
            out.append(sample(logp[out[-1]], temperature=temperature, rng=rng))
        return out


def perplexity(nll: float) -> float:
    """``exp(mean NLL)``: the number of equally likely choices the model is as unsure as."""
    return float(np.exp(nll))
