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
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from posttrainllm.attention import flash_attention
from posttrainllm.checkpointing import recompute
from posttrainllm.fused_cross_entropy import linear_cross_entropy


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
    attention: str = "naive"  # or "flash": the same math, tile by tile; or "sdpa": torch's fused kernel
    n_kv_head: int | None = None  # key/value heads: None = n_head (multi-head), 1 = multi-query, else grouped
    window: int | None = None  # sliding-window attention: each query sees at most this many keys
    seed: int = 0

    def __post_init__(self) -> None:
        choices = {"norm": ("layernorm", "rmsnorm"), "mlp": ("gelu", "swiglu"), "positions": ("learned", "rope"),
                   "attention": ("naive", "flash", "sdpa")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} does not split into n_head={self.n_head} heads")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head={self.n_head} query heads do not group evenly over n_kv_head={self.n_kv_head}")
        if self.window is not None and (self.window < 1 or self.attention != "naive"):
            raise ValueError(f"window={self.window} needs a size >= 1 and attention='naive' (FA2 and SDPA here "
                             "are full causal)")

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain (no mean, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Rotary position embedding on (..., T, D) at positions ``offset .. offset+T-1``: rotate channel
    pairs by position-dependent angles, so a rotated query·key depends only on their distance."""
    t, d = x.shape[-2], x.shape[-1]
    freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angles = torch.arange(offset, offset + t, dtype=x.dtype, device=x.device)[:, None] * freqs
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class KVCache:
    """Keys and values already computed, per layer, so decoding a token costs one row, not a
    recomputation of the whole prefix. It stores ``n_kv_head`` heads — the memory that grouped- and
    multi-query attention save — and, with a sliding window, only the last ``window`` positions."""

    def __init__(self, n_layer: int) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layer
        self.length = 0  # positions seen so far (including any a window has dropped)

    def nbytes(self) -> int:
        return sum(t.nbytes for kv in self.layers if kv for t in kv)

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding drops rejected tokens)."""
        if self.length > length:
            drop = self.length - length
            self.layers = [None if kv is None else (kv[0][:, :, :-drop], kv[1][:, :, :-drop]) for kv in self.layers]
            self.length = length


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """True where query position ``i`` may read key position ``j``: ``j <= i`` and, with a window,
    ``i - j < window``."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= q_pos[:, None] - k_pos[None, :] < window
    return allowed


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        kv_dim = config.kv_heads * config.head_dim
        self.sizes = (config.n_embd, kv_dim, kv_dim)
        self.qkv = nn.Linear(config.n_embd, sum(self.sizes))
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        cfg, (b, t, c) = self.config, x.shape
        q, k, v = self.qkv(x).split(self.sizes, dim=2)
        q = q.view(b, t, cfg.n_head, cfg.head_dim).transpose(1, 2)
        k, v = (z.view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2) for z in (k, v))
        offset = cache.length if cache is not None else 0
        if cfg.positions == "rope":
            q, k = rope(q, offset), rope(k, offset)
        if cache is not None:
            if cache.layers[layer] is not None:
                k, v = (torch.cat(pair, dim=2) for pair in zip(cache.layers[layer], (k, v), strict=True))
            # keys older than the window can never be read by a later query: drop them
            keep = slice(-cfg.window, None) if cfg.window is not None else slice(None)
            cache.layers[layer] = (k[:, :, keep], v[:, :, keep])
        # grouped-query attention: each key/value head serves n_head / kv_heads query heads
        if cfg.kv_heads != cfg.n_head:  # (a repeat of 1 would still copy k and v)
            k, v = (z.repeat_interleave(cfg.n_head // cfg.kv_heads, dim=1) for z in (k, v))
        if cfg.attention == "flash" and offset == 0:
            y = flash_attention(q, k, v, causal=True)
        elif cfg.attention == "sdpa" and offset == 0:  # FlashAttention or memory-efficient kernels on a GPU
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the reference: materialise the scores and mask them
            q_pos = torch.arange(offset, offset + t, device=x.device)
            k_pos = torch.arange(offset + t - k.shape[2], offset + t, device=x.device)
            scores = q @ k.transpose(-2, -1) / math.sqrt(cfg.head_dim)
            y = scores.masked_fill(~attention_mask(q_pos, k_pos, cfg.window), float("-inf")).softmax(-1) @ v
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

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache, layer)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        # gradient checkpointing (module 8): when > 0, training runs the blocks in segments of
        # this many and recomputes their activations in the backward pass. Not part of the
        # config because it changes memory and time, never the numbers.
        self.recompute_segment = 0
        # with targets and gradients on, the head and the loss as one step whose backward is done
        # in the forward (fused_cross_entropy): less memory traffic on a GPU, the same loss and
        # gradients up to rounding, and no logits returned. Off by default: a forward that is
        # never followed by backward() would pay for two matrix multiplies it does not use.
        self.fused_loss = False
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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """Logits (batch, time, vocab); with ``targets``, also the mean cross-entropy loss (and, with
        ``fused_loss`` set and gradients on, ``None`` in place of the logits).

        With a ``cache``, ``idx`` continues the sequence the cache has seen (positions start at
        ``cache.length``) and the new keys and values are appended to it.
        """
        b, t = idx.shape
        offset = cache.length if cache is not None else 0
        if offset + t > self.config.block_size:
            raise ValueError(f"sequence of length {offset + t} is longer than block_size={self.config.block_size}")
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(offset, offset + t, device=idx.device))
        x = self._blocks(x, cache)
        if cache is not None:
            cache.length += t
        x = self.norm(x)
        if targets is not None and self.fused_loss and torch.is_grad_enabled():
            return None, linear_cross_entropy(x, self.head.weight, targets)
        logits = self.head(x)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def _blocks(self, x: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        k = self.recompute_segment
        if not k or cache is not None or not torch.is_grad_enabled():
            for i, block in enumerate(self.blocks):
                x = block(x, cache, i)
            return x
        for start in range(0, len(self.blocks), k):
            segment = self.blocks[start : start + k]
            x = recompute(lambda h, seg=segment: _run(seg, h), x, list(segment.parameters()))
        return x

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _run(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the vocabulary in at least float32: fp16/bf16 logits are upcast, float64 kept."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def kv_cache_bytes(n_layer: int, n_kv_head: int, head_dim: int, tokens: int, bytes_per_value: int = 2) -> int:
    """Memory of a KV cache: a key and a value vector per layer, per key/value head, per token."""
    return 2 * n_layer * n_kv_head * head_dim * tokens * bytes_per_value


def group_kv_heads(model: GPT, n_kv_head: int) -> GPT:
    """A grouped-query copy of a multi-head ``model``: each group's key and value projections are
    the mean of its heads' (the GQA paper's conversion, before any further training)."""
    cfg = model.config
    if cfg.kv_heads != cfg.n_head:
        raise ValueError("group_kv_heads converts a multi-head model (n_kv_head=None)")
    grouped = GPT(replace(cfg, n_kv_head=n_kv_head))
    state = model.state_dict()
    for i in range(cfg.n_layer):
        for name in ("weight", "bias"):
            key = f"blocks.{i}.attn.qkv.{name}"
            q, k, v = state[key].split(cfg.n_embd)
            pooled = [z.view(n_kv_head, -1, cfg.head_dim, *z.shape[1:]).mean(1).flatten(0, 1) for z in (k, v)]
            state[key] = torch.cat([q, *pooled])
    grouped.load_state_dict(state)
    return grouped


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


class Oracle(NamedTuple):
    """Module 7's oracle recipe: the model's shape, its tokenizer and its data."""

    config: GPTConfig
    tokenizer: object  # a posttrainllm.tokenizer.Tokenizer
    train_ids: np.ndarray
    val_ids: np.ndarray


def oracle_config(vocab_size: int) -> GPTConfig:
    """Module 7's oracle GPT: 2 blocks, 4 heads, width 64, over windows of 64 tokens."""
    return GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=64)


def oracle_setup() -> Oracle:
    """The one recipe that module 7 trains and the WASM trainer is checked against: 400,000
    characters of the built-in corpus, a 512-token byte-level BPE, the first 90% to train on, and
    a GPT of 2 blocks, 4 heads and width 64 over windows of 64 tokens."""
    from posttrainllm import data
    from posttrainllm.tokenizer import Tokenizer

    text = data.corpus(n_chars=400_000, seed=0)
    tokenizer = Tokenizer.train(text, vocab_size=512)
    train_ids, val_ids = data.train_val_split(np.array(tokenizer.encode_ordinary(text)), val_fraction=0.1)
    return Oracle(oracle_config(tokenizer.vocab_size), tokenizer, train_ids, val_ids)
