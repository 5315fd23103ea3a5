"""Module 2: numerical gradients, gradient descent, stochastic gradient descent and momentum.

The optimisers here are generic: they take a loss function and a gradient function of a flat
parameter vector ``theta`` and return the whole trajectory, so a notebook can plot every step.
Module 8 re-builds them (and AdamW) as ``torch.optim`` optimisers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Loss = Callable[[np.ndarray], float]
Grad = Callable[[np.ndarray], np.ndarray]

# A loss above this (or not finite) means the step size has blown the iterate away.
DIVERGED = 1e12


def numerical_gradient(f: Loss, theta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Central differences: ``df/dtheta_i ~ (f(theta + eps e_i) - f(theta - eps e_i)) / (2 eps)``.

    The error shrinks like eps^2 (a forward difference only like eps), which is why gradient
    checks use this form. Costs two evaluations of ``f`` per parameter.

    >>> numerical_gradient(lambda t: float(t @ t), np.array([1.0, -2.0])).round(6)
    array([ 2., -4.])
    """
    theta = np.asarray(theta, dtype=float)
    grad = np.zeros_like(theta)
    for i in range(theta.size):
        step = np.zeros_like(theta)
        step.flat[i] = eps
        grad.flat[i] = (f(theta + step) - f(theta - step)) / (2 * eps)
    return grad


@dataclass
class Trajectory:
    """Every iterate and its (full-data) loss; ``diverged`` if the run blew up and was stopped."""

    thetas: np.ndarray  # (steps + 1, n_params)
    losses: np.ndarray  # (steps + 1,)
    diverged: bool

    @property
    def final_loss(self) -> float:
        return float(self.losses[-1])


def _run(loss: Loss, theta0: np.ndarray, steps: int, step_fn: Callable) -> Trajectory:
    theta = np.array(theta0, dtype=float)
    thetas, losses = [theta.copy()], [loss(theta)]
    for t in range(steps):
        theta = step_fn(theta, t)
        value = loss(theta)
        thetas.append(theta.copy())
        losses.append(value)
        if not np.isfinite(value) or value > DIVERGED:
            return Trajectory(np.array(thetas), np.array(losses), diverged=True)
    return Trajectory(np.array(thetas), np.array(losses), diverged=False)


def gradient_descent(
    loss: Loss, grad: Grad, theta0: np.ndarray, lr: float, steps: int, momentum: float = 0.0
) -> Trajectory:
    """Full-batch gradient descent, with optional heavy-ball momentum.

    Each step: ``v = momentum * v + grad(theta)``, then ``theta = theta - lr * v``.
    ``momentum = 0`` is plain gradient descent.
    """
    return sgd(loss, lambda theta, _batch: grad(theta), theta0, lr, steps, momentum=momentum)


def sgd(
    loss: Loss,
    batch_grad: Callable[[np.ndarray, np.ndarray | None], np.ndarray],
    theta0: np.ndarray,
    lr: float,
    steps: int,
    *,
    n_examples: int | None = None,
    batch_size: int | None = None,
    momentum: float = 0.0,
    seed: int = 0,
) -> Trajectory:
    """Stochastic gradient descent: each step uses the gradient on a random minibatch.

    ``batch_grad(theta, idx)`` returns the gradient on the examples ``idx`` (``None`` = all).
    Minibatches are drawn without replacement within a step from a seeded generator, so a run
    is reproducible. The recorded loss is always the full-data loss, to compare runs fairly.
    """
    if lr <= 0:
        raise ValueError(f"the learning rate must be positive, got {lr}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    if (n_examples is None) != (batch_size is None):
        raise ValueError("give both n_examples and batch_size for minibatches, or neither")
    rng = np.random.default_rng(seed)
    velocity = np.zeros_like(np.asarray(theta0, dtype=float))

    def step(theta: np.ndarray, _t: int) -> np.ndarray:
        idx = None if n_examples is None else rng.choice(n_examples, batch_size, replace=False)
        velocity[:] = momentum * velocity + batch_grad(theta, idx)
        return theta - lr * velocity

    return _run(loss, theta0, steps, step)


def steps_to_reach(trajectory: Trajectory, target: float) -> int | None:
    """The first step whose loss is at or below ``target`` (``None`` if it never gets there)."""
    hits = np.flatnonzero(trajectory.losses <= target)
    return int(hits[0]) if hits.size else None


def max_stable_lr(hessian: np.ndarray) -> float:
    """On a quadratic loss, plain gradient descent converges iff ``lr < 2 / lambda_max(H)``.

    Along the Hessian's top eigenvector each step multiplies the error by ``1 - lr * lambda``;
    that factor leaves [-1, 1] exactly when lr passes 2 / lambda_max.
    """
    return 2.0 / float(np.linalg.eigvalsh(np.asarray(hessian, dtype=float)).max())
