"""A Bradley–Terry reward model, and best-of-n sampling against it (the reward-models chapter,
``book/reward-models.md``).

RLHF as in InstructGPT (Ouyang et al., 2022) first learns a *reward model* from human choices
between two responses. The Bradley–Terry model (Bradley and Terry, 1952) says the chosen one
wins with probability ``sigmoid(r(chosen) - r(rejected))``. Minimising ``-log`` of that over the
pairs fits ``r``. Here ``r`` is the SFT model (the base GPT fine-tuned on the chat format) with
its output head replaced by one number read at the response's end token: the network that
learned the language and the format judges the answers.

Best-of-n then samples ``n`` responses from the policy and keeps the one ``r`` scores highest:
the simplest way to optimise against a reward model. Its KL divergence from the policy is often
quoted as ``log n - (n - 1) / n`` (Stiennon et al., 2020); Beirami et al. (2024,
arXiv:2401.01879) show that this is an upper bound, tight only when every output is unlikely,
so for a policy that repeats its answers the true divergence is smaller.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from posttrainllm import preference, sft, tuned
from posttrainllm import progress as bars
from posttrainllm.logit_lens import residual_streams
from posttrainllm.model import GPT
from posttrainllm.optim import AdamW
from posttrainllm.preference import Pair
from posttrainllm.pretrained import Recipe, base_model
from posttrainllm.sft import END, chat_ids
from posttrainllm.tokenizer import Tokenizer


class RewardModel(nn.Module):
    """A copy of ``backbone`` whose final hidden state at the end token is mapped to a scalar."""

    def __init__(self, backbone: GPT) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(backbone)
        self.score = nn.Linear(backbone.config.n_embd, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(self, idx: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Rewards ``(batch,)`` for rows ``idx`` whose final real token is at position ``last``."""
        hidden = self.backbone.norm(residual_streams(self.backbone, idx)[-1])
        return self.score(hidden[torch.arange(len(idx)), last]).squeeze(-1)


def encode(tokenizer: Tokenizer, prompt: str, responses: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, last)``: each response after the chat prompt and ended by the end token, padded on the
    right with end tokens; ``last`` is the position of each row's own end token."""
    end = tokenizer.special_tokens[END]
    rows = [chat_ids(tokenizer, prompt) + tokenizer.encode_ordinary(r) + [end] for r in responses]
    width = max(map(len, rows))
    idx = torch.tensor([r + [end] * (width - len(r)) for r in rows])
    return idx, torch.tensor([len(r) - 1 for r in rows])


def pair_rewards(model: RewardModel, tokenizer: Tokenizer, pairs: list[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of the chosen and of the rejected response of every pair."""
    chosen = torch.cat([model(*encode(tokenizer, p.prompt, [p.chosen])) for p in pairs])
    rejected = torch.cat([model(*encode(tokenizer, p.prompt, [p.rejected])) for p in pairs])
    return chosen, rejected


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """``-log sigmoid(r_chosen - r_rejected)``, averaged over the pairs."""
    return -F.logsigmoid(chosen - rejected).mean()


def train(model: RewardModel, tokenizer: Tokenizer, pairs: list[Pair], steps: int, batch_size: int = 16,
          lr: float = 3e-4, seed: int = 0) -> list[float]:
    """Fit the reward model to ``pairs``; returns the loss per step."""
    optimizer = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in bars.steps(steps, "reward model"):
        batch = [pairs[i] for i in torch.randint(len(pairs), (batch_size,), generator=generator).tolist()]
        loss = bradley_terry_loss(*pair_rewards(model, tokenizer, batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def pairwise_accuracy(model: RewardModel, tokenizer: Tokenizer, pairs: list[Pair]) -> float:
    """Fraction of pairs whose chosen response gets the higher reward."""
    chosen, rejected = pair_rewards(model, tokenizer, pairs)
    return float((chosen > rejected).double().mean())


def best_of_n_kl(n: int) -> float:
    """``log n - (n - 1) / n``: the KL divergence (nats) of best-of-``n`` from the policy as usually
    quoted (Stiennon et al., 2020), which is an upper bound (Beirami et al., 2024), tight only when
    every output is unlikely; for a reward without ties."""
    return math.log(n) - (n - 1) / n


def cached(n_pairs: int | None = None, steps: int = 200, cache_dir: Path | None = None) -> tuple[RewardModel, dict]:
    """The reward-models chapter's reward model, cached: module 9's full SFT model as the backbone,
    fitted (lr 1e-3, batches of 16) to the first ``n_pairs`` (all, if None) of module 9's DPO pairs —
    the LoRA r=4 model's wrong greedy answers to 600 training questions (seed 1), each against the
    right one. Returns ``(model, {"loss": [...]})``."""

    def fit(model: RewardModel) -> dict:
        policy, tokenizer = tuned.sft_model(4, cache_dir=cache_dir)[0], base_model(cache_dir=cache_dir)[1]
        pairs = preference.mistake_pairs(policy, tokenizer, sft.examples("questions", 600, seed=1))[:n_pairs]
        return {"loss": train(model, tokenizer, pairs, steps=steps, lr=1e-3)}

    name = f"reward-{n_pairs or 'all'}-{steps}-{Recipe().key}"
    return tuned._tuned(name, lambda: RewardModel(tuned.sft_model(None, cache_dir=cache_dir)[0]), fit, cache_dir)
