"""Module 8: fp16 mixed-precision training, written out: fp32 master weights, an fp16 working copy,
and dynamic loss scaling (Micikevicius et al., 2017).

Three fp16 facts (module 3) drive the design:

- gradients are small, and fp16 flushes anything below 2^-24 to zero — so the loss is multiplied
  by a large *scale* before backward, and the gradients divided by it afterwards, in fp32;
- fp16 overflows past 65504 — so when a scaled gradient comes back ``inf``/``nan`` the step is
  skipped and the scale halved; after ``growth_interval`` clean steps it is doubled again;
- an fp16 weight cannot absorb an update smaller than about 2^-11 of itself — so the optimizer
  updates an fp32 *master* copy, and the fp16 weights are re-made from it every step.

``torch.amp.GradScaler`` and ``torch.autocast`` do all of this for you; the point here is to see
each piece.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch.nn import functional as F


class LossScaler:
    """Dynamic loss scale: back off on overflow (and say so), grow after a run of good steps."""

    def __init__(self, scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 200) -> None:
        self.scale, self.growth_factor, self.backoff_factor = scale, growth_factor, backoff_factor
        self.growth_interval, self.good_steps = growth_interval, 0

    def unscale_(self, grads: Iterable[torch.Tensor]) -> bool:
        """Divide fp32 gradients by the scale in place; return True if any is inf or nan."""
        found_inf = False
        for g in grads:
            g.div_(self.scale)
            found_inf |= not bool(torch.isfinite(g).all())
        return found_inf

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0


class Fp16Trainer:
    """Train ``model`` (the master, fp32 or wider) through an fp16 copy of it.

    Each :meth:`step` copies the master weights into the fp16 model, runs forward and backward
    there on the scaled loss, moves the gradients to the master in fp32, unscales them, and
    either steps the optimizer or — on overflow — skips the step and backs the scale off.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: LossScaler | None = None) -> None:
        self.master, self.optimizer = model, optimizer
        self.half = copy.deepcopy(model).half()
        self.scaler = scaler or LossScaler()
        self.skipped = 0

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One training step; returns the (unscaled) loss."""
        with torch.no_grad():
            for h, m in zip(self.half.parameters(), self.master.parameters(), strict=True):
                h.copy_(m)  # round the master weights to fp16
        logits = self.half(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))  # the sum in fp32
        self.half.zero_grad(set_to_none=True)
        (loss * self.scaler.scale).backward()
        for h, m in zip(self.half.parameters(), self.master.parameters(), strict=True):
            m.grad = None if h.grad is None else h.grad.to(m.dtype)
        found_inf = self.scaler.unscale_(m.grad for m in self.master.parameters() if m.grad is not None)
        if found_inf:
            self.skipped += 1
        else:
            self.optimizer.step()
        self.scaler.update(found_inf)
        return loss.item()
