"""Module 7's exercises, answered: attention, causal multi-head self-attention, a pre-norm block
and the GPT's forward pass over the package's layers (PyTorch); the online-softmax step and
FlashAttention-2's tile update (numpy); and FlashAttention-2's memory saving, measured."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["attention", "block", "fa2_memory_ratio", "gpt_forward", "self_attention", "tile_update", "update"]


def attention(q, k, v, causal: bool = True):
    """Softmax attention over tensors shaped (batch, heads, time, head_dim)."""
    import torch

    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        t = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return scores.softmax(-1) @ v


def self_attention(x, layer, n_head: int):
    """Causal multi-head self-attention with the weights of ``layer`` (``qkv``, ``proj``)."""
    b, t, c = x.shape
    q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in layer.qkv(x).split(c, dim=2))
    y = attention(q, k, v, causal=True)
    return layer.proj(y.transpose(1, 2).reshape(b, t, c))


def block(x, layer, n_head: int):
    """A pre-norm block: ``x + attention(norm1(x))``, then ``x + mlp(norm2(x))``."""
    import torch.nn.functional as F

    x = x + self_attention(layer.norm1(x), layer.attn, n_head)
    return x + layer.mlp.proj(F.gelu(layer.mlp.up(layer.norm2(x))))


def gpt_forward(model, idx):
    """Token plus position embeddings, every block, the final norm and the tied head."""
    import torch

    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1], device=idx.device))
    for layer in model.blocks:
        x = block(x, layer, model.config.n_head)
    return model.head(model.norm(x))


def update(peak: float, total: float, value: float) -> tuple[float, float]:
    """One online-softmax step: the new running max, and the old sum rescaled to it plus this value's term."""
    new_peak = max(peak, value)
    return new_peak, total * math.exp(peak - new_peak) + math.exp(value - new_peak)


def tile_update(peak: np.ndarray, total: np.ndarray, acc: np.ndarray, s: np.ndarray, v: np.ndarray):
    """FlashAttention-2's inner step for one tile of scores ``s`` and values ``v``: both the
    running sum and the accumulator are rescaled to the new running max."""
    new_peak = np.maximum(peak, s.max(axis=1))
    p = np.exp(s - new_peak[:, None])
    correction = np.exp(peak - new_peak)
    return new_peak, total * correction + p.sum(axis=1), acc * correction[:, None] + p @ v


def fa2_memory_ratio(n: int, block: int, seed: int = 0) -> float:
    """Naive causal attention's extra peak memory over FlashAttention-2's, for one head of ``n``
    positions and width 64 in float32, measured."""
    from posttrainllm import attention as att
    from posttrainllm.measure import extra_peak_bytes

    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, n, 64)).astype(np.float32) for _ in range(3))
    naive = extra_peak_bytes(lambda: att.attention(q, k, v, causal=True))
    return naive / extra_peak_bytes(lambda: att.flash_attention_forward(q, k, v, True, block, block))
