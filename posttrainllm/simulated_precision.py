"""Training in bf16, fp16 and fp8, simulated on the CPU (the training-at-scale chapter,
``book/training-at-scale.md``).

A low-precision matmul rounds its inputs to the narrow format and accumulates in fp32. That is
simulated here by rounding, then widening again: :func:`cast` sends a tensor through the format
and back. :class:`SimulatedLinear` rounds a linear layer's input and weight on the way forward,
and the gradient arriving at its output on the way back. The master weights and the optimizer
stay in fp32, as in mixed-precision training (Micikevicius et al., 2017).

fp8 follows Micikevicius et al., *FP8 Formats for Deep Learning* (2022): e4m3 (more precision)
for weights and activations, e5m2 (more range) for gradients, each tensor multiplied by a scale
that maps its largest magnitude to the format's largest value before rounding. Without that
scale, small gradients fall below e4m3's smallest value and become zero.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
           "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class FormatInfo:
    name: str
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    epsilon: float  # the gap between 1 and the next value up


def describe(name: str) -> FormatInfo:
    dtype = FORMATS[name]
    info = torch.finfo(dtype)
    mantissa = round(-torch.log2(torch.tensor(info.eps, dtype=torch.float64)).item())
    exponent = dtype.itemsize * 8 - 1 - mantissa
    return FormatInfo(name, exponent, mantissa, float(info.max), float(info.smallest_normal),
                      float(info.smallest_normal) * float(info.eps), float(info.eps))


def cast(x: torch.Tensor, fmt: str, scaled: bool = False) -> torch.Tensor:
    """``x`` rounded to ``fmt`` and widened back to its own dtype. Values beyond the format's range
    saturate at its largest value. ``scaled``: multiply by ``max / amax(x)`` first and divide after
    (per-tensor scaling), so the tensor uses the whole range."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {sorted(FORMATS)}")
    if fmt == "fp32":
        return x
    top = torch.finfo(FORMATS[fmt]).max
    scale = top / x.detach().abs().amax().clamp_min(1e-30) if scaled else 1.0
    narrow = (x * scale).clamp(-top, top).to(FORMATS[fmt])
    return narrow.to(x.dtype) / scale


@dataclass(frozen=True)
class Recipe:
    forward: str  # the format of activations and weights
    backward: str  # the format of gradients
    scaled: bool = False


class _Round(torch.autograd.Function):
    """Identity in value up to rounding: the forward rounds to one format, the backward the other."""

    @staticmethod
    def forward(ctx, x, forward_fmt, backward_fmt, scaled):
        ctx.backward_fmt, ctx.scaled = backward_fmt, scaled
        return cast(x, forward_fmt, scaled) if forward_fmt else x

    @staticmethod
    def backward(ctx, grad):
        return (cast(grad, ctx.backward_fmt, ctx.scaled) if ctx.backward_fmt else grad), None, None, None


class SimulatedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, recipe: Recipe) -> None:
        super().__init__()
        self.linear, self.recipe = linear, recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.recipe
        x = _Round.apply(x, r.forward, None, r.scaled)
        w = _Round.apply(self.linear.weight, r.forward, r.backward, r.scaled)
        out = F.linear(x, w, self.linear.bias)
        return _Round.apply(out, None, r.backward, r.scaled)  # the gradient flowing into this matmul


def simulate(model: nn.Module, recipe: Recipe) -> nn.Module:
    """A copy of ``model`` whose every ``nn.Linear`` computes as :class:`SimulatedLinear` does. (The
    attention scores, the embedding and the tied output head are left in the model's dtype.)"""
    simulated = copy.deepcopy(model)
    for module in list(simulated.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child is not getattr(simulated, "head", None):
                setattr(module, name, SimulatedLinear(child, recipe))
    return simulated
