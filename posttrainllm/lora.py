"""Module 9: LoRA — low-rank adapters on a frozen model (Hu et al., 2021).

Fine-tuning changes a weight matrix ``W`` (``d_out x d_in``) by some ``ΔW``. LoRA bets that the
useful ``ΔW`` has low rank and trains it as a product ``B @ A`` of a ``d_out x r`` and an
``r x d_in`` matrix, scaled by ``alpha / r``; ``W`` itself stays frozen. ``B`` starts at zero, so
a freshly injected adapter changes nothing, and only ``(d_in + d_out) * r`` numbers per adapted
matrix are trained — thousands of times fewer than ``W`` for a large model. After training,
``B @ A`` can be merged into ``W`` (no extra cost at inference) or kept apart, small enough to
save on its own and swap: several adapters can share one base model.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from posttrainllm.train import load_file, save_file

ADAPTER_FORMAT = "posttrainllm-lora-adapter v1"


class LoRALinear(nn.Module):
    """``base(x) + (alpha / r) * x A^T B^T`` for the active adapter; ``base`` is frozen."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.A, self.B = nn.ParameterDict(), nn.ParameterDict()
        self.scale: dict[str, float] = {}
        self.active: str | None = None
        self.merged: str | None = None  # the adapter currently folded into base.weight

    def add(self, name: str, rank: int, alpha: float, generator: torch.Generator) -> None:
        d_out, d_in = self.base.weight.shape
        bound = 1 / math.sqrt(d_in)  # A like a fresh nn.Linear's weight; B zero so B @ A = 0
        self.A[name] = nn.Parameter((torch.rand(rank, d_in, generator=generator) * 2 - 1) * bound)
        self.B[name] = nn.Parameter(torch.zeros(d_out, rank))
        self.scale[name] = alpha / rank

    def delta(self, name: str) -> torch.Tensor:
        """The adapter's weight update ``(alpha / r) B @ A``, the shape of ``base.weight``."""
        return self.scale[name] * self.B[name] @ self.A[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        name = self.active
        if name is None or name == self.merged:
            return out
        return out + self.scale[name] * (x @ self.A[name].T) @ self.B[name].T

    @torch.no_grad()
    def merge(self) -> None:
        if self.active is None or self.merged is not None:
            return
        self.base.weight += self.delta(self.active)
        self.merged = self.active

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged is not None:
            self.base.weight -= self.delta(self.merged)
            self.merged = None


def _adapted(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def inject(model: nn.Module, targets: tuple[str, ...], rank: int, alpha: float | None = None,
           name: str = "default", seed: int = 0) -> nn.Module:
    """Add adapter ``name`` of rank ``rank`` to every ``nn.Linear`` whose name ends with one of
    ``targets`` (e.g. ``("attn.qkv", "attn.proj")``), freeze everything else, make it active.
    Calling again with another ``name`` adds a second adapter beside the first."""
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    alpha = float(rank if alpha is None else alpha)
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    for module_name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{module_name}.{child_name}" if module_name else child_name
            if isinstance(child, nn.Linear) and full.endswith(targets):
                setattr(module, child_name, LoRALinear(child))
    adapted = {n: m for n, m in _adapted(model).items() if n.endswith(targets)}
    if not adapted:
        raise ValueError(f"no nn.Linear in the model has a name ending with any of {targets}")
    for layer in adapted.values():
        layer.unmerge()
        layer.add(name, rank, alpha, generator)
    set_adapter(model, name)
    return model


def set_adapter(model: nn.Module, name: str | None) -> None:
    """Switch to adapter ``name`` (``None``: the base model alone); layers it does not adapt run
    their base weights. Only that adapter's matrices train."""
    layers = _adapted(model).values()
    if name is not None and not any(name in layer.A for layer in layers):
        raise ValueError(f"no adapter named {name!r}; this model has {sorted({k for m in layers for k in m.A})}")
    for layer in layers:
        layer.unmerge()
        layer.active = name if name in layer.A else None
        for key in layer.A:
            layer.A[key].requires_grad_(key == name)
            layer.B[key].requires_grad_(key == name)


def merge(model: nn.Module) -> None:
    """Fold the active adapter into the base weights (no extra cost per token); undo with unmerge."""
    for layer in _adapted(model).values():
        layer.merge()


def unmerge(model: nn.Module) -> None:
    for layer in _adapted(model).values():
        layer.unmerge()


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_parameters(d_in: int, d_out: int, rank: int) -> int:
    """Trainable numbers LoRA adds to one ``d_out x d_in`` matrix: ``(d_in + d_out) * r``."""
    return (d_in + d_out) * rank


def save_adapter(model: nn.Module, path: str | Path, name: str | None = None) -> None:
    """Write one adapter's A and B matrices only (not the base), atomically."""
    adapted = _adapted(model)
    name = name or next((m.active for m in adapted.values() if m.active), None)
    layers = {n: m for n, m in adapted.items() if name in m.A}
    if not layers:
        raise ValueError(f"no adapter named {name!r} to save")
    tensors = {f"{layer}.{ab}": getattr(m, ab)[name].detach() for layer, m in layers.items() for ab in ("A", "B")}
    payload = {"format": ADAPTER_FORMAT, "name": name, "scale": next(iter(layers.values())).scale[name],
               "tensors": tensors}
    save_file(payload, path)


def load_adapter(model: nn.Module, path: str | Path) -> str:
    """Add the adapter saved at ``path`` to an injected model of the same shape and activate it.
    A file from something else, or for other layers or shapes, raises ``ValueError``."""
    payload = load_file(path, ADAPTER_FORMAT, "LoRA adapter", "adapter file")
    adapted, name, tensors = _adapted(model), payload["name"], payload["tensors"]
    wanted = sorted({key.rsplit(".", 1)[0] for key in tensors})
    if not set(wanted) <= set(adapted):
        raise ValueError(f"{path} adapts layers {wanted[:3]}..., but this model's adapted layers are "
                         f"{sorted(adapted)[:3]}... (inject the same targets first)")
    for layer_name in wanted:
        layer = adapted[layer_name]
        a, b = tensors[f"{layer_name}.A"], tensors[f"{layer_name}.B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"{path}: layer {layer_name}'s A {tuple(a.shape)} and B {tuple(b.shape)} "
                             "do not share a rank")
        if b.shape[0] != layer.base.weight.shape[0] or a.shape[1] != layer.base.weight.shape[1]:
            raise ValueError(f"{path}: layer {layer_name} has shape {tuple(layer.base.weight.shape)}, "
                             f"the adapter expects {(b.shape[0], a.shape[1])}")
        layer.A[name], layer.B[name] = nn.Parameter(a.clone()), nn.Parameter(b.clone())
        layer.scale[name] = payload["scale"]
    set_adapter(model, name)
    return name
