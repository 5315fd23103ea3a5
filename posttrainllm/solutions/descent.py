"""Module 2's exercises, answered: a central-difference gradient, descent with heavy-ball momentum,
and the largest learning rate at which momentum still converges, found by bisection."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from posttrainllm.gradient_descent import numerical_gradient

__all__ = ["descend", "divergence_limit", "numerical_gradient"]


def descend(grad: Callable[[np.ndarray], np.ndarray], theta0: np.ndarray, lr: float, momentum: float,
            steps: int) -> np.ndarray:
    """``steps`` of gradient descent with heavy-ball momentum from ``theta0``; the final theta."""
    theta = np.array(theta0, dtype=float)
    velocity = np.zeros_like(theta)
    for _ in range(steps):
        velocity = momentum * velocity + grad(theta)
        theta = theta - lr * velocity
    return theta


def divergence_limit(loss: Callable[[np.ndarray], float], grad: Callable[[np.ndarray], np.ndarray],
                     start: np.ndarray, momentum: float, low: float, high: float, steps: int = 400) -> float:
    """The largest learning rate between ``low`` (converges) and ``high`` (diverges) at which
    :func:`descend` does not end above its starting loss, by 40 halvings of the interval."""
    def diverges(lr: float) -> bool:
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run overflows to inf, then nan
            end = loss(descend(grad, start, lr, momentum, steps))
        return not end <= loss(start)  # nan compares False: it counts as diverged

    for _ in range(40):
        middle = (low + high) / 2
        low, high = (low, middle) if diverges(middle) else (middle, high)
    return low
