"""The output head and its cross-entropy as one step, with the backward pass done in the forward.

A GPT's last matrix multiply writes a (tokens x vocabulary) matrix of logits: at GPT-2 small's
shape and 64 rows of 1024 tokens, 65,536 x 50,304 bf16 numbers, 6.6 GB. ``F.cross_entropy`` then
reads all of it in the forward pass, reads it again in the backward pass and writes a gradient
of the same size. That traffic, not arithmetic, sets the time. Here a kernel per row finds the
row's log-sum-exp and, sweeping the row a second time, overwrites each logit with its gradient,
``softmax - onehot``; the head's two backward matrix multiplies run at once, and the backward
pass only scales their results by the incoming gradient of the loss. This is Liger-Kernel's
fused linear cross-entropy (Hsu et al., 2024, arXiv:2410.10989) without its chunking, one row of
logits per kernel program.

On a CUDA device with Triton the row kernel is Triton; elsewhere the same arithmetic runs in
PyTorch, so the CPU tests check the method and the GPU benchmark checks the kernel against it.
The cost of doing the backward early: with gradients on but no ``backward()`` called, the two
extra matrix multiplies are wasted, so ``GPT`` uses this only when asked (``fused_loss``).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # F.cross_entropy's default: a target that adds no loss and no gradient
# Logits a Triton program reads at a time, and its warps. Reading a whole row once instead (65,536
# logits held in 32 warps' registers, so the second sweep reads nothing) made the kernel about twice
# as slow in a probe on an H100.
BLOCK, WARPS = 4096, 8


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``F.cross_entropy(h @ weight.T, targets, ignore_index=ignore_index)``, the mean over the
    targets that are not ``ignore_index``, with the logits never kept. Under autocast, ``h`` and
    ``weight`` are cast to its dtype first, as ``F.linear`` would be."""
    if h.shape[:-1] != targets.shape:
        raise ValueError(f"h of shape {tuple(h.shape)} needs targets of shape {tuple(h.shape[:-1])}, "
                         f"got {tuple(targets.shape)}")
    kind = h.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        h, weight = h.to(dtype), weight.to(dtype)
    return _LinearCrossEntropy.apply(h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1), ignore_index)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, ignore_index):
        loss, grad_h, grad_weight = torch.ops.posttrainllm.linear_cross_entropy(h, weight, targets, ignore_index)
        ctx.save_for_backward(grad_h, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_weight = ctx.saved_tensors
        return grad_h * grad_loss, grad_weight * grad_loss, None, None


def loss_and_grads(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean loss and its gradients with respect to ``h`` and ``weight``, all in one go."""
    logits = h @ weight.T
    count = (targets != ignore_index).sum()
    scale = 1.0 / count.to(_loss_dtype(h))  # a device tensor: no wait for the GPU to say how many
    losses = _rows(logits, targets, ignore_index, scale)  # logits now hold d loss / d logits
    return losses.sum() * scale, logits @ weight, logits.T @ h


# an operator of its own, so torch.compile calls it as one opaque step (shapes from the fake below)
_op = torch.library.custom_op("posttrainllm::linear_cross_entropy", loss_and_grads, mutates_args=())


@_op.register_fake
def _(h, weight, targets, ignore_index):
    return h.new_empty((), dtype=_loss_dtype(h)), torch.empty_like(h), torch.empty_like(weight)


def _loss_dtype(h: torch.Tensor) -> torch.dtype:
    return torch.promote_types(h.dtype, torch.float32)  # 16-bit logits are summed in fp32, float64 kept


def _rows(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, scale: torch.Tensor) -> torch.Tensor:
    """Each row's loss; overwrites ``logits`` with ``(softmax - onehot) * scale`` (zero where the
    target is ``ignore_index``)."""
    if logits.is_cuda and logits.dtype != torch.float64 and _triton_rows is not None:
        return _triton_rows(logits, targets.contiguous(), ignore_index, scale)
    valid = targets != ignore_index
    picked = targets.clamp(min=0)  # any column will do for an ignored row: its loss is zeroed
    x = logits.to(_loss_dtype(logits))
    lse = torch.logsumexp(x, dim=-1)
    losses = torch.where(valid, lse - x.gather(1, picked[:, None]).squeeze(1), 0.0)
    grad = torch.exp(x - lse[:, None])
    grad[torch.arange(len(targets), device=logits.device), picked] -= 1.0
    logits.copy_(grad * (valid * scale)[:, None])
    return losses


def _make_triton_rows():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def cross_entropy_rows(logits, stride, targets, losses, scale, vocab, ignore_index, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits + row * stride
        cols = tl.arange(0, BLOCK)
        m, s = -float("inf"), 0.0  # running max and sum of exp(x - max): one exp per logit
        for start in range(0, vocab, BLOCK):
            x = tl.load(base + start + cols, mask=start + cols < vocab, other=-float("inf")).to(tl.float32)
            top = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - top) + tl.sum(tl.exp(x - top), 0)
            m = top
        lse = m + tl.log(s)
        target = tl.load(targets + row)
        valid = target != ignore_index
        picked = tl.load(base + tl.where(valid, target, 0)).to(tl.float32)  # before it is overwritten
        tl.store(losses + row, tl.where(valid, lse - picked, 0.0))
        weight = tl.where(valid, tl.load(scale), 0.0)
        for start in range(0, vocab, BLOCK):  # the row again: each logit becomes its gradient
            c = start + cols
            x = tl.load(base + c, mask=c < vocab, other=0.0).to(tl.float32)
            grad = (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0)) * weight
            tl.store(base + c, grad.to(logits.dtype.element_ty), mask=c < vocab)

    def rows(logits, targets, ignore_index, scale):
        losses = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        cross_entropy_rows[(logits.shape[0],)](logits, logits.stride(0), targets, losses, scale, logits.shape[1],
                                   ignore_index, BLOCK=BLOCK, num_warps=WARPS)
        return losses

    return rows


_triton_rows = _make_triton_rows() if torch.cuda.is_available() else None
