"""Weight-only quantization to int8 and int4 by rounding to nearest (the inference and serving
chapter, ``book/inference-serving.md``).

Each row of a weight matrix (one output feature) is cut into groups of ``group_size`` inputs;
each group keeps one float scale, ``absmax / qmax``, and its weights become the integers
``round(w / scale)`` in ``[-qmax - 1, qmax]`` with ``qmax = 2**(bits - 1) - 1``. int8 with one
group per row is the absmax scheme of LLM.int8() (Dettmers et al., 2022) without its fp16
outlier path; int4 with groups of 32 to 128 is the round-to-nearest baseline that GPTQ (Frantar
et al., 2022) and AWQ (Lin et al., 2023) improve on. int4 values are packed two to a byte, so the
byte counts here are what would be stored.

:class:`QuantizedLinear` stores only the integers and the scales and dequantizes in its forward:
it saves memory, not time, since PyTorch on the CPU has no int4 matmul to call.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"{cols} input features do not split into groups of {group_size}")
    return w.reshape(rows, cols // group_size, group_size)


def quantize(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: ``q`` int8 holding values in ``[-2**(bits-1), 2**(bits-1) - 1]``, shaped like ``w``;
    ``scales`` one per (row, group)."""
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be between 2 and 8, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    groups = _grouped(w.detach(), group_size)
    scales = groups.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny) / qmax
    q = torch.round(groups / scales).clamp(-qmax - 1, qmax).to(torch.int8)
    return q.reshape(w.shape), scales.squeeze(-1)


def dequantize(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    return (_grouped(q, group_size).to(scales.dtype) * scales.unsqueeze(-1)).reshape(q.shape)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit values per byte (low nibble first); ``q`` holds values in [-8, 7] and an even count per row."""
    nibbles = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    low, high = (packed & 0xF).to(torch.int8), (packed >> 4).to(torch.int8)
    both = torch.stack([low, high], -1).reshape(*packed.shape[:-1], -1)
    return torch.where(both > 7, both - 16, both)


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is stored as ``bits``-bit integers and per-group scales."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int) -> None:
        super().__init__()
        self.bits, self.group_size = bits, group_size
        q, scales = quantize(linear.weight, bits, group_size)
        self.register_buffer("weight_q", pack_int4(q) if bits == 4 else q)
        self.register_buffer("scales", scales)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def weight(self) -> torch.Tensor:
        q = unpack_int4(self.weight_q) if self.bits == 4 else self.weight_q
        return dequantize(q, self.scales, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)


def quantize_model(model: nn.Module, bits: int, group_size: int | None = None) -> nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` inside ``model.blocks`` quantized (one group per row
    when ``group_size`` is None). The embedding and the output head, tied to it, stay in float."""
    quantized = copy.deepcopy(model)
    for block in quantized.blocks:
        for module in list(block.modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, child_name, QuantizedLinear(child, bits, group_size or child.in_features))
    return quantized


def stored_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, each shared tensor counted once."""
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())
