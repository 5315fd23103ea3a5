"""Module 1: a linear model, its mean squared error, and the least-squares fit.

The model is ``y_hat = w * x + b``. Everything is numpy: no framework, so each line of the
math is a line of code. ``theta`` packs the parameters as ``np.array([w, b])`` so that the
generic optimisers of module 2 can move them.
"""

from __future__ import annotations

import numpy as np


def make_line_data(
    n: int = 40, slope: float = 2.0, intercept: float = -1.0, noise: float = 0.8, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points ``(x, slope*x + intercept + gaussian noise)`` with x uniform in [-3, 3].

    The same seed always gives the same points, so every figure in the book is reproducible.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3.0, 3.0, size=n)
    y = slope * x + intercept + noise * rng.standard_normal(n)
    return x, y


def predict(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The line's prediction at each x: ``theta = [w, b]`` -> ``w * x + b``."""
    w, b = theta
    return w * np.asarray(x) + b


def mse(y_hat: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error: ``mse([1, 2], [1, 4]) == (0 + 4) / 2 == 2.0``."""
    diff = np.asarray(y_hat, dtype=float) - np.asarray(y, dtype=float)
    return float(np.mean(diff * diff))


def mse_loss(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """The loss as a function of the parameters: what gradient descent minimises."""
    return mse(predict(theta, x), y)


def mse_grad(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d(mse)/d[w, b], by the chain rule: with r = w*x + b - y, L = mean(r^2),

    dL/dw = mean(2 r * x)   and   dL/db = mean(2 r * 1).
    """
    x = np.asarray(x, dtype=float)
    r = predict(theta, x) - y
    return np.array([np.mean(2 * r * x), np.mean(2 * r)])


def fit_closed_form(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares line in closed form: ``w = cov(x, y) / var(x)``, ``b = mean(y) - w mean(x)``.

    Setting both partial derivatives of the MSE to zero gives these two equations.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D and the same length, got {x.shape} and {y.shape}")
    dx = x - x.mean()
    var = float(dx @ dx)
    if var == 0.0:
        raise ValueError("all x values are equal: every slope fits equally well, so w is undetermined")
    w = float(dx @ (y - y.mean())) / var
    return np.array([w, y.mean() - w * x.mean()])


def fit_normal_equations(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares for any number of features: solve ``(X^T X) theta = X^T y``.

    ``X`` is ``features`` with a column of ones appended (that column's weight is the bias),
    so for one feature this returns the same ``[w, b]`` as :func:`fit_closed_form`.
    """
    features = np.asarray(features, dtype=float)
    if features.ndim == 1:
        features = features[:, None]
    design = np.hstack([features, np.ones((len(features), 1))])
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ValueError("the features are linearly dependent: X^T X is singular, no unique fit")
    return np.linalg.solve(design.T @ design, design.T @ np.asarray(y, dtype=float))


def loss_surface(
    x: np.ndarray, y: np.ndarray, ws: np.ndarray, bs: np.ndarray
) -> np.ndarray:
    """The MSE at every ``(w, b)`` of a grid: ``out[i, j] = mse_loss([ws[j], bs[i]])`` (for contour plots)."""
    w, b = np.meshgrid(ws, bs)
    residual = w[..., None] * np.asarray(x) + b[..., None] - np.asarray(y)
    return np.mean(residual**2, axis=-1)


def mse_hessian(x: np.ndarray) -> np.ndarray:
    """The MSE's second derivatives in ``[w, b]``: ``(2/n) X^T X`` with ``X = [x, 1]``.

    The loss is an exact quadratic in ``(w, b)``, so this matrix is the same everywhere;
    module 2 reads the largest stable learning rate off its top eigenvalue.
    """
    design = np.stack([np.asarray(x, dtype=float), np.ones(len(x))], axis=1)
    return 2.0 * design.T @ design / len(x)
