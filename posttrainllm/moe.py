"""Mixture of experts: a top-k router over small MLPs, and the load-balancing loss that keeps it fair.

A MoE layer replaces one MLP by ``n_experts`` of them and a router that sends each token to
its ``top_k`` highest-scoring experts, so the parameter count grows with the number of experts
while the compute per token stays that of ``top_k`` MLPs. Left alone, a router tends to favour
the experts it already favours (they get more tokens, so they get better, so they win more);
the Switch Transformer's auxiliary loss ``n_experts * sum_i f_i * P_i`` — ``f_i`` the fraction
of routed tokens expert ``i`` received, ``P_i`` its mean router probability — is 1 at perfectly
even load and grows as the load concentrates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


def load_balancing_loss(probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Switch Transformer auxiliary loss from router probabilities ``(tokens, E)`` and the chosen
    expert indices ``(tokens, k)``. Only ``P`` carries a gradient (``f`` is a count)."""
    n_experts = probs.shape[-1]
    fraction = torch.bincount(chosen.flatten(), minlength=n_experts).to(probs.dtype) / chosen.numel()
    return n_experts * (fraction * probs.mean(0)).sum()


class MoE(nn.Module):
    """``top_k`` of ``n_experts`` GELU MLPs per token, weighted by the router's probabilities
    (renormalised over the chosen experts when ``top_k > 1``, as in Mixtral; the raw top-1
    probability when ``top_k == 1``, as in Switch)."""

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts={n_experts}, got {top_k}")
        self.top_k = top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)) for _ in range(n_experts)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(output, aux_loss, chosen)`` for tokens ``x`` of shape ``(tokens, dim)``."""
        probs = self.router(x).softmax(-1)
        gates, chosen = probs.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):  # each expert runs once, on just its tokens
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if len(token):
                out.index_add_(0, token, gates[token, slot, None] * expert(x[token]))
        return out, load_balancing_loss(probs, chosen), chosen


def expert_load(chosen: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Fraction of routed token slots each expert received (sums to 1)."""
    return torch.bincount(chosen.flatten(), minlength=n_experts).double() / chosen.numel()


@dataclass(frozen=True)
class RoutingRun:
    aux_weight: float
    top_k: int
    load: list[float]  # per expert, on a held-out batch
    aux_loss: float
    mse: float

    @property
    def busiest(self) -> float:
        """The busiest expert's load over its fair share (1.0 = perfectly even)."""
        return max(self.load) * len(self.load)


def train_toy_router(
    aux_weight: float, top_k: int = 1, n_experts: int = 8, steps: int = 300, seed: int = 0
) -> RoutingRun:
    """Fit a MoE layer to a fixed random teacher MLP on clustered inputs (32 clusters, like token
    types) with ``mse + aux_weight * load_balancing_loss``; report the held-out expert load."""
    torch.manual_seed(seed)
    dim = 16
    teacher = nn.Sequential(nn.Linear(dim, 64), nn.Tanh(), nn.Linear(64, dim))
    centers = torch.randn(32, dim) * 2
    model = MoE(dim, 32, n_experts, top_k)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = centers[torch.randint(0, len(centers), (n,), generator=generator)] + 0.5 * torch.randn(
            n, dim, generator=generator
        )
        with torch.no_grad():
            return x, teacher(x)

    for _ in range(steps):
        x, target = batch(256)
        out, aux, _ = model(x)
        loss = F.mse_loss(out, target) + aux_weight * aux
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    x, target = batch(4096)
    with torch.no_grad():
        out, aux, chosen = model(x)
    return RoutingRun(
        aux_weight, top_k, expert_load(chosen, n_experts).tolist(), aux.item(), F.mse_loss(out, target).item()
    )
