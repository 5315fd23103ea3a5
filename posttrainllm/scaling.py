"""Module 5: fitting a scaling law to a sweep of tiny models (a toy of Kaplan et al. / Chinchilla).

The fitted form is ``L(N) = a * N**(-alpha) + c``: loss falls as a power of the parameter
count ``N`` towards an irreducible floor ``c``. Training compute is estimated as ``C = 6 N D``
FLOPs for ``D`` training tokens (forward 2ND + backward 4ND).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PowerLaw:
    a: float
    alpha: float
    c: float

    def __call__(self, n: np.ndarray | float) -> np.ndarray:
        return self.a * np.asarray(n, dtype=float) ** (-self.alpha) + self.c


def fit_power_law(n: np.ndarray, loss: np.ndarray, floors: int = 400) -> PowerLaw:
    """Least-squares fit in log space: for each candidate floor ``c`` below the smallest loss,
    ``log(L - c)`` is linear in ``log N``; keep the ``c`` with the smallest residual."""
    n, loss = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    if n.shape != loss.shape or n.size < 3:
        raise ValueError("need at least three (N, loss) points of matching length")
    best = None
    for c in np.linspace(0.0, loss.min() * 0.999, floors):
        slope, intercept = np.polyfit(np.log(n), np.log(loss - c), 1)
        residual = np.sum((np.exp(intercept) * n**slope + c - loss) ** 2)
        if best is None or residual < best[0]:
            best = (residual, PowerLaw(float(np.exp(intercept)), float(-slope), float(c)))
    return best[1]


def training_flops(n_params: float, n_tokens: float) -> float:
    """``6 N D``: the standard estimate of training compute."""
    return 6.0 * n_params * n_tokens


def compute_frontier(compute: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """Indices of the runs on the compute-optimal frontier: no cheaper run reached a lower loss."""
    compute, loss = np.asarray(compute), np.asarray(loss)
    frontier, best = [], np.inf
    for i in np.argsort(compute, kind="stable"):
        if loss[i] < best:
            frontier.append(int(i))
            best = loss[i]
    return np.array(frontier, dtype=int)
