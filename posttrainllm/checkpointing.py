"""Module 8: gradient checkpointing (activation recomputation), and a meter for activation memory.

Backpropagation needs the activations of the forward pass, so a plain forward keeps every
block's intermediate tensors alive until the backward pass reaches it. :func:`recompute` runs a
segment of the network without keeping them — only the segment's input is saved — and runs the
segment again inside the backward pass to rebuild them just when they are needed. With ``n``
blocks in segments of ``k``, the memory is about ``n / k`` saved segment inputs plus one
segment's ``k`` blocks of activations, smallest near ``k = sqrt(n)`` (Chen et al., 2016), for
the price of one extra forward pass.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, n_params, x, *params):
        ctx.run, ctx.n_params = run, n_params
        ctx.save_for_backward(x, *params)
        with torch.no_grad():  # nothing inside the segment is kept for backward
            return run(x)

    @staticmethod
    def backward(ctx, grad_out):
        x, *params = ctx.saved_tensors
        x = x.detach().requires_grad_(x.requires_grad)
        with torch.enable_grad():  # the second forward, this time building the graph
            out = ctx.run(x)
        inputs = [x, *params] if x.requires_grad else params
        grads = list(torch.autograd.grad(out, inputs, grad_out, allow_unused=True))
        grad_x = grads.pop(0) if x.requires_grad else None
        return (None, None, grad_x, *grads)


def recompute(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, params: Sequence[torch.Tensor]):
    """``run(x)``, keeping only ``x`` for the backward pass and recomputing the rest there.

    ``params`` must list every tensor ``run`` reads that needs a gradient (the segment's weights),
    so that their gradients flow. ``run`` must be deterministic (no dropout here)."""
    return _Recompute.apply(run, len(params), x, *params)


class ActivationMeter:
    """Peak bytes of tensors saved for backward while the context is active, not counting
    ``exclude`` (the parameters: they are memory either way). A tensor saved twice — the same
    storage kept by two operations — counts once; it stops counting when autograd frees it."""

    def __init__(self, exclude: Sequence[torch.Tensor] = ()) -> None:
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.refs: dict[int, int] = {}
        self.live = self.peak = 0

    def _pack(self, t: torch.Tensor):
        key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        holder = _Saved(t)
        if key in self.exclude:
            return holder
        if self.refs.get(key, 0) == 0:
            self.live += size
            self.peak = max(self.peak, self.live)
        self.refs[key] = self.refs.get(key, 0) + 1
        weakref.finalize(holder, self._release, key, size)
        return holder

    def _release(self, key: int, size: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.live -= size

    def __enter__(self) -> ActivationMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda holder: holder.tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class _Saved:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
