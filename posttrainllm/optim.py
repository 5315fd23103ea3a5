"""Module 8: optimizers from their equations — SGD with momentum, Adam, AdamW — plus the
warmup + cosine learning-rate schedule and global-norm gradient clipping.

Each update rule is written twice: as a numpy function of plain arrays (to read next to the
paper, and to run where PyTorch does not), and as a ``torch.optim.Optimizer`` that applies the
same function's arithmetic to every parameter tensor. The tests hold the torch versions to
``torch.optim``'s own results step by step.

Adam vs AdamW (Loshchilov & Hutter): Adam's "weight decay" adds ``wd * w`` to the gradient, so
the decay is divided by ``sqrt(v)`` like everything else — large-gradient weights barely decay.
AdamW shrinks the weight directly, ``w -= lr * wd * w``, independent of the gradient's scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch


def sgd_momentum_update(w: np.ndarray, g: np.ndarray, buf: np.ndarray | None, lr: float, momentum: float = 0.9):
    """One SGD step with (heavy-ball) momentum: ``buf = momentum * buf + g``; ``w -= lr * buf``.
    Returns ``(w, buf)``; pass ``buf=None`` on the first step (it starts as ``g``, as in torch)."""
    buf = g.copy() if buf is None else momentum * buf + g
    return w - lr * buf, buf


def adamw_update(
    w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float,
    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
    decoupled: bool = True,
):
    """One Adam(W) step at step number ``t`` (1-based). Returns ``(w, m, v)``.

    ``decoupled=True`` is AdamW (decay the weight itself); ``False`` is Adam with L2 decay folded
    into the gradient.
    """
    b1, b2 = betas
    if decoupled:
        w = w * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * w
    m = b1 * m + (1 - b1) * g  # running mean of gradients (momentum)
    v = b2 * v + (1 - b2) * g * g  # running mean of squared gradients (per-weight scale)
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)  # undo the bias of starting both at zero
    return w - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


class SGD(torch.optim.Optimizer):
    """SGD with optional momentum (the update of :func:`sgd_momentum_update`)."""

    def __init__(self, params, lr: float, momentum: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad
                if group["momentum"]:
                    state = self.state[p]
                    if "buf" not in state:
                        state["buf"] = d_p.clone()
                    else:
                        state["buf"].mul_(group["momentum"]).add_(d_p)
                    d_p = state["buf"]
                p.add_(d_p, alpha=-group["lr"])
        return loss


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay (the update of :func:`adamw_update`)."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0 or eps < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid hyperparameters: lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:  # moments shaped (and, under FSDP2, sharded) like the parameter
                    state.update(step=0, m=torch.zeros_like(param), v=torch.zeros_like(param))
                state["step"] += 1
                t = state["step"]
                p, g, m, v = (_local(x) for x in (param, param.grad, state["m"], state["v"]))
                if self.decoupled:
                    p.mul_(1 - lr * wd)
                else:
                    g = g.add(p, alpha=wd)
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                # the same arithmetic as adamw_update, arranged as torch does to stay within rounding
                denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1**t))
        return loss


class NumpyAdamW(AdamW):
    """AdamW whose arithmetic is a numpy function of one parameter's arrays,
    ``update(w, g, m, v, t, lr, betas, eps, weight_decay) -> (w, m, v)``: by default
    :func:`adamw_update`, and in module 8 the reader's own, which then trains a GPT. It copies
    each parameter to numpy and back, so it is for CPU tensors and small models."""

    def __init__(self, params, update=adamw_update, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)
        self.update = update

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(step=0, m=np.zeros(param.shape), v=np.zeros(param.shape))
                state["step"] += 1
                w, m, v = self.update(param.numpy(force=True).copy(), param.grad.numpy(force=True).copy(),
                                      state["m"], state["v"], state["step"], group["lr"], group["betas"],
                                      group["eps"], group["weight_decay"])
                state["m"], state["v"] = np.asarray(m, dtype=float), np.asarray(v, dtype=float)
                param.copy_(torch.as_tensor(np.asarray(w), dtype=param.dtype))
        return loss


class Adam(AdamW):
    """Adam; its ``weight_decay`` is the L2 kind, added to the gradient (default 0)."""

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay)


def warmup_cosine(step: int, max_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Learning rate at ``step`` (counted from 0): a linear warmup, ``max_lr * (step + 1) / warmup``,
    so step 0 already trains at ``max_lr / warmup`` and step ``warmup - 1`` reaches ``max_lr``; then
    a half cosine from ``max_lr`` at step ``warmup`` down to ``min_lr`` at ``total``; ``min_lr`` after."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> float:
    """Scale all gradients in place so their combined L2 norm is at most ``max_norm``; return the
    norm before clipping. One global norm keeps the update's direction, unlike clipping each value."""
    grads = [p.grad for p in params if p.grad is not None]
    total = _global_norm(grads)
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        for g in grads:
            _local(g).mul_(scale)
    return total


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of an FSDP2 tensor (a DTensor), as a plain tensor sharing its memory;
    any other tensor as it is. An elementwise update gives the same numbers either way, but every
    operation on a DTensor pays for its dispatch on the CPU, and a GPT has 148 parameters times
    AdamW's nine operations (``benchmarks/training_mechanics.py`` times the step both ways)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _global_norm(grads: list[torch.Tensor]) -> float:
    """L2 norm of all ``grads`` together. FSDP2's gradients are DTensors, each process holding a
    shard: the squares of the local shards are summed over the processes."""
    import torch.distributed as dist

    sharded, plain = [], grads
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.tensor import DTensor

        sharded = [g for g in grads if isinstance(g, DTensor)]
        plain = [g for g in grads if not isinstance(g, DTensor)]
    if not sharded:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()

    def squares(tensors: list[torch.Tensor]) -> torch.Tensor:
        return sum((torch.linalg.vector_norm(t) ** 2 for t in tensors), torch.zeros((), device=grads[0].device))

    square = squares([g.to_local() for g in sharded])
    dist.all_reduce(square, group=sharded[0].device_mesh.get_group())
    return (square + squares(plain)).sqrt().item()
