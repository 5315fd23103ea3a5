"""Small 2-D datasets generated in the package, for classifiers whose decision boundary you can plot."""

from __future__ import annotations

import numpy as np


def make_moons(n: int = 100, noise: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaving half circles: ``X`` of shape (n, 2) and labels ``y`` in {0, 1}.

    No straight line separates them, so a model needs a non-linearity to classify them.
    """
    if n < 2:
        raise ValueError(f"need at least 2 points, got n={n}")
    rng = np.random.default_rng(seed)
    n_top = n // 2
    t_top, t_bottom = np.linspace(0, np.pi, n_top), np.linspace(0, np.pi, n - n_top)
    top = np.stack([np.cos(t_top), np.sin(t_top)], axis=1)
    bottom = np.stack([1 - np.cos(t_bottom), 0.5 - np.sin(t_bottom)], axis=1)
    x = np.concatenate([top, bottom]) + noise * rng.standard_normal((n, 2))
    y = np.concatenate([np.zeros(n_top, dtype=int), np.ones(n - n_top, dtype=int)])
    order = rng.permutation(n)
    return x[order], y[order]
