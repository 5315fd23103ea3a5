"""Induction heads in a two-layer attention-only transformer, and the tools that find them
(the interpretability chapter, ``book/interpretability.md``).

An induction head completes a pattern it saw earlier in the context: having seen ``... A B ...``,
at a later ``A`` it attends to the token after the earlier ``A`` and copies ``B`` (Elhage et al.,
*A Mathematical Framework for Transformer Circuits*, 2021; Olsson et al., *In-context Learning and
Induction Heads*, 2022). It needs two heads in two layers: a *previous-token head* in layer 0 that
writes "the token before me was A" into each position, and the induction head in layer 1 whose
key reads that. So the model here has no MLPs and no norms: every head's output is a separate
term of the residual stream, which is what lets a head be read, patched or removed on its own.

The training data are random token sequences repeated once: the first half cannot be predicted
(its loss stays near ``log(vocab)``), the second half can be predicted perfectly, but only by
induction. The length of the repeated half changes from batch to batch: with a fixed length a
layer-0 head can learn "attend ``half - 1`` positions back" from the position embeddings alone and
predict the repeat without reading any token, which is not induction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from posttrainllm.optim import AdamW

Head = tuple[int, int]  # (layer, head)


@dataclass
class Run:
    """One forward pass: logits and, per layer, each head's output ``(B, H, T, d_model)`` and
    attention pattern ``(B, H, T, T)``."""

    logits: torch.Tensor
    head_outputs: list[torch.Tensor]
    patterns: list[torch.Tensor]


class AttentionOnly(nn.Module):
    """Token and position embeddings, ``n_layer`` layers of causal multi-head attention added to the
    residual stream, and an unembedding. Nothing else."""

    def __init__(self, vocab_size: int, context: int, n_layer: int = 2, n_head: int = 4, d_model: int = 64,
                 seed: int = 0) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} must be a multiple of n_head={n_head}")
        generator = torch.Generator().manual_seed(seed)

        def init(*shape: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=generator) / fan_in**0.5)

        self.n_head, self.d_head = n_head, d_model // n_head
        self.embed = init(vocab_size, d_model, fan_in=1)
        self.pos = init(context, d_model, fan_in=1)
        self.qkv = nn.ParameterList([init(3, n_head, d_model, self.d_head, fan_in=d_model) for _ in range(n_layer)])
        self.out = nn.ParameterList([init(n_head, self.d_head, d_model, fan_in=d_model) for _ in range(n_layer)])
        self.unembed = init(d_model, vocab_size, fan_in=d_model)

    def forward(self, idx: torch.Tensor, patch: dict[Head, torch.Tensor] | None = None,
                ablate: frozenset[Head] = frozenset()) -> Run:
        """``patch`` replaces a head's output by the given ``(B, T, d_model)`` tensor (activation
        patching); a head in ``ablate`` writes nothing (zero ablation)."""
        T = idx.shape[1]
        x = self.embed[idx] + self.pos[:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        outputs, patterns = [], []
        for layer, (qkv, out) in enumerate(zip(self.qkv, self.out, strict=True)):
            q, k, v = torch.einsum("btd,chde->cbhte", x, qkv)
            scores = (q @ k.transpose(-1, -2)) / self.d_head**0.5
            pattern = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            heads = torch.einsum("bhte,hed->bhtd", pattern @ v, out)
            for head in range(self.n_head):
                if (layer, head) in ablate:
                    heads = heads.index_fill(1, torch.tensor([head]), 0.0)
                if patch and (layer, head) in patch:
                    heads = torch.cat([heads[:, :head], patch[(layer, head)][:, None], heads[:, head + 1:]], 1)
            x = x + heads.sum(1)
            outputs.append(heads)
            patterns.append(pattern)
        return Run(x @ self.unembed, outputs, patterns)


def repeated_tokens(batch: int, half: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` sequences of ``half`` uniformly random tokens, each followed by itself: ``(batch, 2*half)``."""
    first = torch.randint(vocab_size, (batch, half), generator=generator)
    return torch.cat([first, first], 1)


def half_losses(logits: torch.Tensor, idx: torch.Tensor) -> tuple[float, float]:
    """Mean next-token loss over the predictions of the first half and over those of the second
    (the positions whose target is a repeat)."""
    half = idx.shape[1] // 2
    loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), idx[:, 1:], reduction="none")
    return loss[:, : half - 1].mean().item(), loss[:, half - 1:].mean().item()


def train(model: AttentionOnly, steps: int, halves: tuple[int, int], vocab_size: int, batch: int = 32,
          lr: float = 1e-3, seed: int = 0) -> dict[str, list[float]]:
    """Train on repeated sequences whose half length is drawn from ``halves`` (inclusive) at each
    step, with the book's AdamW; returns per-step first- and second-half losses."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    history: dict[str, list[float]] = {"first": [], "second": []}
    for _ in range(steps):
        half = int(torch.randint(halves[0], halves[1] + 1, (), generator=generator))
        idx = repeated_tokens(batch, half, vocab_size, generator)
        logits = model(idx).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        first, second = half_losses(logits.detach(), idx)
        history["first"].append(first)
        history["second"].append(second)
    return history


def previous_token_scores(run: Run) -> torch.Tensor:
    """Per (layer, head): the mean attention a position pays to the one just before it."""
    return torch.stack([p.diagonal(-1, -2, -1).mean((0, 2)) for p in run.patterns])


def prefix_matching_scores(run: Run) -> torch.Tensor:
    """Per (layer, head), on repeated sequences: the mean attention a second-half position pays to
    the token *after* its own earlier occurrence (offset ``half - 1`` back), the induction target."""
    half = run.patterns[0].shape[-1] // 2
    return torch.stack([p.diagonal(-(half - 1), -2, -1)[..., 1:].mean((0, 2)) for p in run.patterns])


def second_half_loss(model: AttentionOnly, idx: torch.Tensor, targets: torch.Tensor, **intervention) -> float:
    """The loss on the second half's predictions of ``targets`` when the model reads ``idx``."""
    half = idx.shape[1] // 2
    logits = model(idx, **intervention).logits[:, half - 1:-1]
    return F.cross_entropy(logits.transpose(1, 2), targets[:, half:]).item()


def patching_recovery(model: AttentionOnly, clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """Activation patching, per (layer, head): run the corrupted input with that one head's output
    taken from the clean run, and report the fraction of the clean-vs-corrupted loss gap on the
    clean targets it closes (1: the head alone restores the clean prediction; 0: no effect)."""
    with torch.no_grad():
        clean_run = model(clean)
        clean_loss = second_half_loss(model, clean, clean)
        corrupted_loss = second_half_loss(model, corrupted, clean)
        layers, heads = len(clean_run.head_outputs), model.n_head
        recovery = torch.zeros(layers, heads, dtype=torch.float64)
        for layer in range(layers):
            for head in range(heads):
                patch = {(layer, head): clean_run.head_outputs[layer][:, head]}
                patched = second_half_loss(model, corrupted, clean, patch=patch)
                recovery[layer, head] = (corrupted_loss - patched) / (corrupted_loss - clean_loss)
    return recovery


def ablation_damage(model: AttentionOnly, idx: torch.Tensor) -> torch.Tensor:
    """Per (layer, head): how much the second-half loss rises when that head is zero-ablated."""
    with torch.no_grad():
        base = second_half_loss(model, idx, idx)
        layers, heads = len(model.qkv), model.n_head
        return torch.tensor([[second_half_loss(model, idx, idx, ablate=frozenset({(layer, head)})) - base
                              for head in range(heads)] for layer in range(layers)], dtype=torch.float64)
