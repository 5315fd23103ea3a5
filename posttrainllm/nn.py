"""Module 4: neurons, layers and a multi-layer perceptron built from autograd ``Value`` scalars.

Weights are drawn from a seeded generator with the usual 1/sqrt(fan_in) scale, so the same seed
gives the same network; :meth:`MLP.weights` exports them as numpy arrays so the tensor engine
and PyTorch can run *the same* network for comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posttrainllm.autograd import Value, total

ACTIVATIONS = ("tanh", "relu", "linear")


class Neuron:
    """``act(w . x + b)`` for one output."""

    def __init__(self, n_inputs: int, activation: str, rng: np.random.Generator, value: type = Value) -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        scale = 1 / np.sqrt(n_inputs)
        self.w = [value(float(v)) for v in rng.uniform(-scale, scale, n_inputs)]
        self.b = value(0.0)
        self.activation = activation

    def __call__(self, x: Sequence[Value | float]) -> Value:
        if len(x) != len(self.w):
            raise ValueError(f"this neuron takes {len(self.w)} inputs, got {len(x)}")
        z = total(wi * xi for wi, xi in zip(self.w, x, strict=True)) + self.b
        return z if self.activation == "linear" else getattr(z, self.activation)()

    def parameters(self) -> list[Value]:
        return [*self.w, self.b]


class Layer:
    """``n_outputs`` neurons reading the same inputs."""

    def __init__(self, n_inputs: int, n_outputs: int, activation: str, rng: np.random.Generator,
                 value: type = Value) -> None:
        self.neurons = [Neuron(n_inputs, activation, rng, value) for _ in range(n_outputs)]

    def __call__(self, x: Sequence[Value | float]) -> list[Value]:
        return [n(x) for n in self.neurons]

    def parameters(self) -> list[Value]:
        return [p for n in self.neurons for p in n.parameters()]


class MLP:
    """Layers of sizes ``[n_inputs, *hidden, n_outputs]``; hidden layers use ``activation``,
    the last layer is linear (it outputs logits). ``value`` is the scalar class the weights are made
    of: the book's :class:`~posttrainllm.autograd.Value`, or one the reader wrote in module 4."""

    def __init__(self, sizes: Sequence[int], activation: str = "tanh", seed: int = 0, value: type = Value) -> None:
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs input and output sizes, got {list(sizes)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        rng = np.random.default_rng(seed)
        last = len(sizes) - 2
        self.sizes = list(sizes)
        self.activation = activation
        self.layers = [
            Layer(sizes[i], sizes[i + 1], "linear" if i == last else activation, rng, value) for i in range(last + 1)
        ]

    def __call__(self, x: Sequence[Value | float]) -> list[Value]:
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self) -> list[Value]:
        return [p for layer in self.layers for p in layer.parameters()]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = 0.0

    def weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[(W, b), ...]`` per layer with ``W`` of shape (n_in, n_out): ``y = x @ W + b``."""
        return [
            (
                np.array([[n.w[i].data for n in layer.neurons] for i in range(len(layer.neurons[0].w))]),
                np.array([n.b.data for n in layer.neurons]),
            )
            for layer in self.layers
        ]


def cross_entropy(logits: Sequence[Value], target: int) -> Value:
    """``-log softmax(logits)[target]``, computed as ``logsumexp(logits) - logits[target]``.

    The maximum logit is subtracted first (as a constant) so ``exp`` never overflows.
    """
    if not 0 <= target < len(logits):
        raise ValueError(f"target {target!r} is not a class index for {len(logits)} logits")
    shift = max(z.data for z in logits)
    log_sum = total((z - shift).exp() for z in logits).log() + shift
    return log_sum - logits[target]


def batch_loss(model: MLP, X: np.ndarray, y: np.ndarray) -> Value:
    """The mean cross-entropy of ``model`` over the rows of ``X`` and their classes ``y``."""
    losses = [cross_entropy(model([float(v) for v in x]), int(t)) for x, t in zip(X, y, strict=True)]
    return total(losses) * (1 / len(losses))
