"""Module 4: the same reverse-mode autograd as :mod:`posttrainllm.autograd`, on whole arrays.

A scalar engine builds one graph node per multiply; a layer of a real network has millions.
Here a node holds a numpy array and its backward rule is an array expression (a matmul, a sum),
so the Python overhead is paid per *operation*, not per number — the reason every framework
works on tensors. Broadcasting is the one new idea: an input that was stretched in the forward
pass must have its gradient summed back to its own shape (:func:`unbroadcast`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from posttrainllm.autograd import backpropagate


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting stretched, giving an array of ``shape``.

    >>> unbroadcast(np.ones((4, 3)), (3,)).tolist()
    [4.0, 4.0, 4.0]
    """
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


def _as_tensor(other: object, op: str) -> Tensor:
    if isinstance(other, Tensor):
        return other
    if isinstance(other, int | float | np.ndarray) and not isinstance(other, bool):
        return Tensor(other)
    raise TypeError(f"unsupported operand for Tensor {op}: {type(other).__name__}; use a number, ndarray or Tensor")


class Tensor:
    """An array in a computation graph; ``grad`` has the same shape as ``data``."""

    def __init__(self, data, parents: tuple[Tensor, ...] = (), op: str = "") -> None:
        self.data = np.array(data, dtype=np.float64)
        if np.isnan(self.data).any():
            raise ValueError("Tensor data contains NaN")
        self.grad = np.zeros_like(self.data)
        self.parents = parents
        self.op = op
        self._backward: Callable[[], None] = lambda: None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, op={self.op or 'leaf'!r})"

    def __add__(self, other) -> Tensor:
        other = _as_tensor(other, "+")
        out = Tensor(self.data + other.data, (self, other), "+")

        def _backward() -> None:
            self.grad += unbroadcast(out.grad, self.shape)
            other.grad += unbroadcast(out.grad, other.shape)

        out._backward = _backward
        return out

    def __mul__(self, other) -> Tensor:
        other = _as_tensor(other, "*")
        out = Tensor(self.data * other.data, (self, other), "*")

        def _backward() -> None:
            self.grad += unbroadcast(other.data * out.grad, self.shape)
            other.grad += unbroadcast(self.data * out.grad, other.shape)

        out._backward = _backward
        return out

    def __matmul__(self, other) -> Tensor:
        other = _as_tensor(other, "@")
        if self.data.ndim != 2 or other.data.ndim != 2 or self.shape[1] != other.shape[0]:
            raise ValueError(f"matmul needs (n, k) @ (k, m), got {self.shape} @ {other.shape}")
        out = Tensor(self.data @ other.data, (self, other), "@")

        def _backward() -> None:
            self.grad += out.grad @ other.data.T
            other.grad += self.data.T @ out.grad

        out._backward = _backward
        return out

    def sum(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        out = Tensor(self.data.sum(axis=axis, keepdims=keepdims), (self,), "sum")

        def _backward() -> None:
            grad = out.grad if keepdims or axis is None else np.expand_dims(out.grad, axis)
            self.grad += np.broadcast_to(grad, self.shape)

        out._backward = _backward
        return out

    def mean(self) -> Tensor:
        return self.sum() * (1.0 / self.data.size)

    def tanh(self) -> Tensor:
        t = np.tanh(self.data)
        out = Tensor(t, (self,), "tanh")

        def _backward() -> None:
            self.grad += (1 - t * t) * out.grad

        out._backward = _backward
        return out

    def relu(self) -> Tensor:
        out = Tensor(np.maximum(self.data, 0), (self,), "relu")

        def _backward() -> None:
            self.grad += (self.data > 0) * out.grad

        out._backward = _backward
        return out

    def cross_entropy(self, targets: Sequence[int] | np.ndarray) -> Tensor:
        """Mean softmax cross-entropy of logits of shape (n, classes) against integer targets.

        One fused node: its backward is the famous ``(softmax - one_hot) / n``.
        """
        targets = np.asarray(targets)
        n, classes = self.shape
        if targets.shape != (n,) or targets.min() < 0 or targets.max() >= classes:
            raise ValueError(f"targets must be {n} class indices in [0, {classes}), got {targets!r}")
        shifted = self.data - self.data.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        out = Tensor(-log_probs[np.arange(n), targets].mean(), (self,), "cross_entropy")

        def _backward() -> None:
            grad = np.exp(log_probs)
            grad[np.arange(n), targets] -= 1
            self.grad += grad / n * out.grad

        out._backward = _backward
        return out

    def __neg__(self) -> Tensor:
        return self * -1.0

    def __sub__(self, other) -> Tensor:
        return self + (-_as_tensor(other, "-"))

    def __radd__(self, other) -> Tensor:
        return self + other

    def __rmul__(self, other) -> Tensor:
        return self * other

    def backward(self) -> None:
        """Same contract as ``Value.backward``: leaves accumulate, intermediates start from zero."""
        if self.data.size != 1:
            raise ValueError(f"backward() needs a scalar output, got shape {self.shape}; reduce it first")
        backpropagate(self, lambda node: np.zeros_like(node.data))


def mlp_forward(x: Tensor, params: Sequence[tuple[Tensor, Tensor]], activation: str = "tanh") -> Tensor:
    """The logits of an MLP given ``[(W, b), ...]`` (see ``posttrainllm.nn.MLP.weights``)."""
    for i, (w, b) in enumerate(params):
        x = x @ w + b
        if i < len(params) - 1:
            x = getattr(x, activation)()
    return x
