"""Module 7: the oracle GPT — a small decoder-only transformer in PyTorch.

Every faster version in this book (FlashAttention, the WASM trainer, WebGPU kernels, fp16,
checkpointing) is judged by the drift of its numbers from this model's on the same weights.
It reads top to bottom in the order a reader meets the ideas: config, norms, attention, MLP,
block, GPT. Pre-norm blocks (``x + attn(norm(x))``, ``x + mlp(norm(x))``), learned or rotary
positions, GELU or SwiGLU MLP, tied or untied output head.

Initialisation is deterministic from ``config.seed``: every ``nn.Linear`` and ``nn.Embedding``
weight is drawn from N(0, 0.02), the residual output projections are scaled by
``1/sqrt(2 * n_layer)`` (as in GPT-2), and biases and norm gains start at 0 and 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from posttrainllm.attention import flash_attention


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 64  # the longest context the model sees
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    norm: str = "layernorm"  # or "rmsnorm"
    mlp: str = "gelu"  # or "swiglu"
    positions: str = "learned"  # or "rope"
    tie_weights: bool = True
    attention: str = "naive"  # or "flash": the same math, tile by tile
    seed: int = 0

    def __post_init__(self) -> None:
        choices = {"norm": ("layernorm", "rmsnorm"), "mlp": ("gelu", "swiglu"), "positions": ("learned", "rope"),
                   "attention": ("naive", "flash")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} does not split into n_head={self.n_head} heads")


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain (no mean, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (..., T, D): rotate channel pairs by position-dependent
    angles, so the dot product of a rotated query and key depends only on their distance."""
    t, d = x.shape[-2], x.shape[-1]
    freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angles = torch.arange(t, dtype=x.dtype, device=x.device)[:, None] * freqs
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.config.n_head
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        if self.config.positions == "rope":
            q, k = rope(q), rope(k)
        if self.config.attention == "flash":
            y = flash_attention(q, k, v, causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(c // h)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = 4 * config.n_embd
        self.kind = config.mlp
        if self.kind == "swiglu":
            hidden = int(2 * hidden / 3)  # keeps the parameter count close to the GELU MLP's
            self.gate = nn.Linear(config.n_embd, hidden)
        self.up = nn.Linear(config.n_embd, hidden)
        self.proj = nn.Linear(hidden, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.proj(F.silu(self.gate(x)) * self.up(x))
        return self.proj(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        norm = nn.LayerNorm if config.norm == "layernorm" else RMSNorm
        self.norm1, self.attn = norm(config.n_embd), CausalSelfAttention(config)
        self.norm2, self.mlp = norm(config.n_embd), MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd) if config.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.LayerNorm(config.n_embd) if config.norm == "layernorm" else RMSNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        self._init_weights()

    def _init_weights(self) -> None:
        generator = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim == 2:
                    std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("proj.weight") else 0.02
                    p.copy_(torch.randn(p.shape, generator=generator) * std)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.fill_(1.0)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (batch, time, vocab); with ``targets``, also the mean cross-entropy loss."""
        b, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(f"sequence of length {t} is longer than block_size={self.config.block_size}")
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def export_weights(model: GPT) -> dict:
    """Plain data for the WASM and WebGPU ports: ``{"config": {...}, "tensors": {name: {"shape",
    "data"}}}`` with every tensor as a flat row-major list of float32 values (tied weights once)."""
    return {
        "format": "posttrainllm-gpt-weights v1",
        "config": asdict(model.config),
        "tensors": {
            name: {"shape": list(t.shape), "data": t.detach().float().flatten().tolist()}
            for name, t in model.state_dict().items()
            if not (model.config.tie_weights and name == "head.weight")
        },
    }
