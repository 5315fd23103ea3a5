"""Module 4's exercises, answered. The engine the reader writes is the book's own
:mod:`posttrainllm.autograd`; the rest are written here."""

from __future__ import annotations

import math

from posttrainllm import nn
from posttrainllm.autograd import Value, backpropagate, topological_order

__all__ = ["Value", "backpropagate", "backward", "graph_size", "softplus", "topological_order", "train_step"]

backward = Value.backward  # topological_order, then posttrainllm.autograd.backpropagate


def softplus(x: Value) -> Value:
    """``log(1 + e**x)``; its derivative is the sigmoid ``1 / (1 + e**-x)``."""
    out = type(x)(math.log1p(math.exp(x.data)), parents=(x,), op="softplus")

    def _backward() -> None:
        x.grad += 1 / (1 + math.exp(-x.data)) * out.grad

    out._backward = _backward
    return out


def train_step(model: nn.MLP, X, y, lr: float) -> float:
    """One step of gradient descent on the batch; the loss before the step."""
    loss = nn.batch_loss(model, X, y)
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad
    return loss.data


def graph_size(loss: Value) -> int:
    """How many nodes the loss's graph holds, inputs and parameters included: each counted once."""
    return len(topological_order(loss))
