"""Module 10: the logit lens (nostalgebraist, 2020) — what the model would predict at each depth.

The residual stream is a running sum: the embedding, plus each block's contribution. The lens
reads it after every block as if it were the last one — through the final norm and the
unembedding — and so shows at which depth the eventual prediction appears. After the last
block it is, by construction, exactly the model's own output.
"""

from __future__ import annotations

import torch

from posttrainllm.model import GPT


@torch.no_grad()
def residual_streams(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream ``(batch, time, n_embd)`` after the embedding and after each block."""
    model.eval()
    x = model.tok_emb(idx)
    if model.pos_emb is not None:
        x = x + model.pos_emb(torch.arange(idx.shape[1]))
    streams = [x]
    for block in model.blocks:
        x = block(x)
        streams.append(x)
    return streams


@torch.no_grad()
def logit_lens(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Logits ``(layers + 1, batch, time, vocab)``: every residual stream read through the final
    norm and the unembedding."""
    return torch.stack([model.head(model.norm(x)) for x in residual_streams(model, idx)])


def answer_ranks(lens_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Rank (0 = top) of each position's target token at each depth: ``(layers + 1, batch, time)``."""
    target_logit = lens_logits.gather(-1, targets.expand(lens_logits.shape[:-1]).unsqueeze(-1))
    return (lens_logits > target_logit).sum(-1)
