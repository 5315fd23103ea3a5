"""Module 5: a neural character-level language model (the MLP of Bengio et al., 2003).

Embed each of the last ``context`` characters, concatenate, one tanh hidden layer, logits over
the vocabulary. Compared with the bigram table it *shares* what it learns across similar
contexts, so it generalises where counts have never seen a combination.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class CharMLP(nn.Module):
    def __init__(self, vocab_size: int, context: int = 3, embed: int = 16, hidden: int = 128) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab_size, embed)
        self.hidden = nn.Linear(context * embed, hidden)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx`` (batch, context) of ids -> logits (batch, vocab)."""
        return self.out(torch.tanh(self.hidden(self.embed(idx).flatten(1))))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def windows(ids, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (``context`` ids, next id) pair of a sequence, as two tensors."""
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    if len(ids) <= context:
        raise ValueError(f"need more than context={context} ids, got {len(ids)}")
    x = ids.unfold(0, context, 1)[:-1]
    return x, ids[context:]


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 8192) -> float:
    """Mean cross-entropy (nats per character) over all of ``x, y``."""
    model.eval()
    total = sum(
        nn.functional.cross_entropy(model(x[i : i + batch]), y[i : i + batch], reduction="sum").item()
        for i in range(0, len(x), batch)
    )
    model.train()
    return total / len(x)


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    batch_size: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Adam on random minibatches; returns the training loss of every step. Seeded: same run every time."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(x), (batch_size,), generator=generator)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def generate(model: CharMLP, start: list[int], length: int, sampler, rng: np.random.Generator) -> list[int]:
    """Extend ``start`` by ``length`` ids, each drawn by ``sampler(logits, rng)`` from the model."""
    model.eval()
    out = list(start)
    for _ in range(length):
        logits = model(torch.tensor([out[-model.context :]]))[0].double().numpy()
        out.append(sampler(logits, rng))
    model.train()
    return out
