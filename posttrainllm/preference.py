"""Module 9: preference tuning with DPO (Rafailov et al., 2023).

Given a prompt and two responses, one *chosen* and one *rejected*, DPO raises the policy's
log-probability of the chosen response relative to a frozen *reference* model, and lowers the
rejected one's, with the loss

    -log sigmoid(beta * [(log pi(c) - log ref(c)) - (log pi(r) - log ref(r))])

The bracket, times beta, is the *implicit reward margin*: how much more the policy prefers the
chosen answer than the reference did. No reward model and no sampling — just two forward
passes per pair through each model. When the two responses are identical the margin is 0 and
the loss is log 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from posttrainllm import progress as bars
from posttrainllm.model import GPT, log_probs
from posttrainllm.optim import AdamW
from posttrainllm.sft import END, IGNORE, Example, pack, render
from posttrainllm.tokenizer import Tokenizer


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def _rows(tokenizer: Tokenizer, pairs: list[Pair], responses: str, block_size: int):
    rendered = [render(tokenizer, Example(p.prompt, getattr(p, responses), "")) for p in pairs]
    rows = [pack([r], block_size, tokenizer.special_tokens[END]) for r in rendered]  # one pair per row
    return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])


def response_logprob(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each row's sum of the log-probabilities of its response tokens (the targets that are not
    ``IGNORE``), from logits of shape ``(rows, T, vocab)`` and targets of shape ``(rows, T)``."""
    logp = log_probs(logits)
    mask = targets != IGNORE
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1)


def sequence_logprob(model: GPT, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:func:`response_logprob` of the model's logits for ``inputs``."""
    return response_logprob(model(inputs), targets)


def dpo_margin(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
               ref_rejected: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """Each pair's implicit reward margin: beta times the chosen log-ratio minus the rejected one."""
    return beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))


def dpo_objective(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                  ref_rejected: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """The mean DPO loss, ``-log sigmoid(margin)`` over the pairs (Rafailov et al., 2023)."""
    return -F.logsigmoid(dpo_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)).mean()


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean loss, per-pair implicit reward margins)`` from sequence log-probabilities."""
    args = (policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    return dpo_objective(*args), dpo_margin(*args).detach()


def preference_accuracy(model: GPT, tokenizer: Tokenizer, pairs: list[Pair]) -> float:
    """Fraction of pairs where the model gives the chosen response more probability."""
    block = model.config.block_size
    with torch.no_grad():
        chosen = sequence_logprob(model, *_rows(tokenizer, pairs, "chosen", block))
        rejected = sequence_logprob(model, *_rows(tokenizer, pairs, "rejected", block))
    return (chosen > rejected).float().mean().item()


def train_dpo(policy: GPT, reference: GPT, tokenizer: Tokenizer, pairs: list[Pair], steps: int,
              batch_size: int = 16, lr: float = 1e-3, beta: float = 0.1, nll_weight: float = 0.0,
              seed: int = 0, logprob: Callable = response_logprob, objective: Callable = dpo_objective) -> dict:
    """DPO on the policy's trainable parameters; the reference stays frozen. Returns the loss, the
    mean implicit reward margin and the chosen responses' mean log-probability after every step.

    DPO only asks chosen to beat rejected *relative to the reference*; it can get there by
    lowering both, and greedy answers then fall apart. ``nll_weight > 0`` adds that multiple of
    the chosen responses' per-token negative log-likelihood — plain SFT on the chosen answers
    (as in RPO, Pang et al. 2024) — which keeps the right answer likely in absolute terms.
    ``logprob(logits, targets)`` and ``objective(...)`` are :func:`response_logprob` and
    :func:`dpo_objective` unless a reader's own are given (module 9 runs DPO on the reader's)."""
    block = policy.config.block_size
    chosen, rejected = _rows(tokenizer, pairs, "chosen", block), _rows(tokenizer, pairs, "rejected", block)
    with torch.no_grad():
        reference.eval()
        ref_c, ref_r = logprob(reference(chosen[0]), chosen[1]), logprob(reference(rejected[0]), rejected[1])
    optimizer = AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    history: dict = {"loss": [], "margin": [], "chosen_logp": []}
    n_tokens = (chosen[1] != IGNORE).sum(-1)
    policy.train()
    for _ in bars.steps(steps, "DPO"):
        rows = torch.randint(0, len(pairs), (batch_size,), generator=generator)
        pol_c = logprob(policy(chosen[0][rows]), chosen[1][rows])
        pol_r = logprob(policy(rejected[0][rows]), rejected[1][rows])
        loss = objective(pol_c, pol_r, ref_c[rows], ref_r[rows], beta)
        margin = dpo_margin(pol_c, pol_r, ref_c[rows], ref_r[rows], beta).detach()
        if nll_weight:
            loss = loss - nll_weight * (pol_c / n_tokens[rows]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history["loss"].append(loss.item())
        history["margin"].append(margin.mean().item())
        history["chosen_logp"].append(pol_c.mean().item())
    policy.eval()
    return history


def mistake_pairs(model: GPT, tokenizer: Tokenizer, examples: list[Example]) -> list[Pair]:
    """Pairs from the model's own wrong greedy answers: the right answer chosen, its answer rejected.
    Examples it already answers right give no pair."""
    from posttrainllm.sft import reply

    answers = [reply(model, tokenizer, e.prompt).strip() for e in examples]
    return [Pair(e.prompt, e.response, a) for e, a in zip(examples, answers, strict=True) if a != e.response]


def contrast_pairs(examples: list[Example]) -> list[Pair]:
    """Preference pairs from task examples: the right response is chosen; rejected is a wrong
    answer of the same form (a question's answer taken from another story), or, for the
    storybook task, the plain sentence left as it was."""
    pairs = []
    for i, e in enumerate(examples):
        if e.task == "storybook":
            rejected = e.prompt.removeprefix("Tell it the old way: ")
        else:
            form = e.prompt.rsplit(". ", 1)[-1].split()[0]  # What / Where / Who
            others = [o.response for o in examples[i + 1:] + examples[:i]
                      if o.prompt.rsplit(". ", 1)[-1].split()[0] == form and o.response != e.response]
            if not others:
                continue
            rejected = others[0]
        pairs.append(Pair(e.prompt, e.response, rejected))
    return pairs
