"""Module 10: a sparse autoencoder on the residual stream (Bricken et al., *Towards
Monosemanticity*, 2023).

A model's hidden vector mixes many features into few dimensions. An SAE re-expresses it in an
over-complete dictionary — ``f = ReLU(W_enc (x - b_dec) + b_enc)``, ``x_hat = W_dec f + b_dec``
with many more features than dimensions — trained to reconstruct ``x`` while an L1 penalty
keeps few features on at once, so each one has a chance to mean one thing. Its report card:

- **L0**: features active per token (lower is sparser);
- **dead features**: never active on the evaluation tokens (wasted dictionary);
- **fraction of variance unexplained**: reconstruction error over the variance of ``x``;
- **loss recovered**: splice ``x_hat`` into the model in place of ``x`` and compare the LM loss
  with the original and with ``x`` zero-ablated: ``(L_ablate - L_sae) / (L_ablate - L_orig)``,
  1 when the SAE loses nothing the model uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from posttrainllm.logit_lens import residual_streams
from posttrainllm.model import GPT


class SparseAutoencoder(nn.Module):
    def __init__(self, dim: int, n_features: int, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        decoder = torch.randn(dim, n_features, generator=generator)
        self.W_dec = nn.Parameter(decoder / decoder.norm(dim=0, keepdim=True))  # unit-norm dictionary
        self.W_enc = nn.Parameter(self.W_dec.detach().T.clone())  # start as the decoder's transpose
        self.b_enc = nn.Parameter(torch.zeros(n_features))
        self.b_dec = nn.Parameter(torch.zeros(dim))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu((x - self.b_dec) @ self.W_enc.T + self.b_enc)

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.W_dec.T + self.b_dec

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.encode(x)
        return self.decode(f), f


def sae_loss(sae: SparseAutoencoder, x: torch.Tensor, l1: float) -> torch.Tensor:
    """The objective: squared reconstruction error per token plus ``l1`` times each active
    feature's size weighted by its decoder column's norm, both averaged over the batch."""
    x_hat, f = sae(x)
    return (x - x_hat).pow(2).sum(-1).mean() + l1 * (f * sae.W_dec.norm(dim=0)).sum(-1).mean()


def sae_step(sae: SparseAutoencoder, x: torch.Tensor, l1: float, optimizer: torch.optim.Optimizer) -> float:
    """One training step on the batch ``x``: :func:`sae_loss`, backward, ``optimizer.step()``.
    Returns the loss before the step."""
    loss = sae_loss(sae, x, l1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


Step = Callable[[SparseAutoencoder, torch.Tensor, float, torch.optim.Optimizer], float]


def train_sae(sae: SparseAutoencoder, activations: torch.Tensor, steps: int, l1: float, batch_size: int = 1024,
              lr: float = 1e-3, seed: int = 0, step: Step = sae_step) -> list[float]:
    """Minimise :func:`sae_loss`, ``|x - x_hat|^2 + l1 * sum_i f_i |W_dec[:, i]|`` (the L1 weighted by
    decoder norms, so shrinking features while growing their decoder columns cannot cheat the penalty),
    with Adam on random batches of ``activations``; ``step`` takes each step (module 10's reader
    writes one)."""
    optimizer = torch.optim.Adam(sae.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = activations[torch.randint(0, len(activations), (batch_size,), generator=generator)]
        losses.append(float(step(sae, x, l1, optimizer)))
    return losses


@dataclass(frozen=True)
class SAEReport:
    l0: float
    dead_fraction: float
    fvu: float
    loss_original: float
    loss_sae: float
    loss_ablated: float

    @property
    def loss_recovered(self) -> float:
        return (self.loss_ablated - self.loss_sae) / (self.loss_ablated - self.loss_original)


def _loss_with(model: GPT, layer: int, x: torch.Tensor, y: torch.Tensor, replace) -> float:
    """LM loss with the residual stream after block ``layer - 1`` (0 = the embeddings) replaced."""
    handle = None
    if replace is not None:
        target = model.blocks[layer - 1] if layer > 0 else None
        if target is None:
            raise ValueError("splice after a block (layer >= 1)")
        handle = target.register_forward_hook(lambda _m, _i, out: replace(out))
    try:
        with torch.no_grad():
            return model(x, y)[1].item()
    finally:
        if handle is not None:
            handle.remove()


@torch.no_grad()
def evaluate_sae(sae: SparseAutoencoder, model: GPT, layer: int, x: torch.Tensor, y: torch.Tensor) -> SAEReport:
    """The SAE's report card on token batch ``(x, y)``, for the residual stream after block ``layer``."""
    acts = residual_streams(model, x)[layer].reshape(-1, sae.W_dec.shape[0])
    recon, f = sae(acts)
    fvu = ((acts - recon).pow(2).sum() / (acts - acts.mean(0)).pow(2).sum()).item()
    return SAEReport(
        l0=(f > 0).float().sum(-1).mean().item(),
        dead_fraction=((f > 0).sum(0) == 0).float().mean().item(),
        fvu=fvu,
        loss_original=_loss_with(model, layer, x, y, None),
        loss_sae=_loss_with(model, layer, x, y, lambda out: sae(out)[0]),
        loss_ablated=_loss_with(model, layer, x, y, torch.zeros_like),
    )


@contextlib.contextmanager
def steer(model: GPT, layer: int, direction: torch.Tensor, scale: float) -> Iterator[None]:
    """Inside the block, add ``scale * direction`` to the residual stream that enters block ``layer``
    (the stream :func:`~posttrainllm.logit_lens.residual_streams` lists at index ``layer``), at every
    position: feature steering with an SAE decoder column (Templeton et al., 2024)."""
    if not 1 <= layer <= len(model.blocks):
        raise ValueError(f"layer must be between 1 and {len(model.blocks)} (the stream after a block), got {layer}")
    handle = model.blocks[layer - 1].register_forward_hook(lambda module, args, out: out + scale * direction)
    try:
        yield
    finally:
        handle.remove()
