"""Module 10: evals — held-out loss and perplexity, rewards for the verifiable task, and
memorisation tests (exact continuations, and planted canaries).

An eval is a number with a question behind it. Held-out loss asks "how well does the model
predict text it never trained on"; exact match asks "does it answer right"; the memorisation
tests ask "is that right answer *learned* or *remembered*" — by comparing how often a model
reproduces the exact continuation of training texts with how often it does so for held-out
texts of the same kind (extractability: a prefix in, the exact suffix out by greedy decoding,
as in Carlini et al., 2022, *Quantifying Memorization*), and by planting random canaries in
fine-tuning data and measuring how far the model ranks them above chance (the *exposure* of
Carlini et al., 2019, *The Secret Sharer*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from posttrainllm.model import GPT, log_probs
from posttrainllm.train import evaluate, greedy


def perplexity(model: GPT, ids, batches: int = 8) -> float:
    """``exp`` of the mean held-out cross-entropy: the effective number of equally likely next
    tokens the model is choosing between."""
    return math.exp(evaluate(model, ids, batches=batches))


# --- rewards for the verifiable task (module 10's GRPO uses them too) --------------------------


def correctness(completion: str, answer: str) -> float:
    """1 if the completion is exactly the answer (surrounding spaces ignored), else 0."""
    return float(isinstance(completion, str) and completion.strip() == answer.strip())


def format_reward(completion: str, max_words: int = 8) -> float:
    """1 if the completion looks like an answer: non-empty, one line, at most ``max_words`` words,
    no chat tokens. Says nothing about whether it is right."""
    if not isinstance(completion, str):
        return 0.0
    text = completion.strip()
    ok = bool(text) and "\n" not in text and len(text.split()) <= max_words and "<|" not in text
    return float(ok)


def composite_reward(completion: str, answer: str, correct_weight: float = 1.0, format_weight: float = 0.2) -> float:
    """``correct_weight * correctness + format_weight * format``: right answers dominate, and a
    well-formed wrong one still beats a rambling one."""
    return correct_weight * correctness(completion, answer) + format_weight * format_reward(completion)


# --- memorisation: exact continuations ---------------------------------------------------------


def greedy_continuation(model: GPT, context: list[int], n_tokens: int) -> list[int]:
    """The model's greedy next ``n_tokens`` after ``context`` (its end trimmed to fit the window)."""
    return greedy(model, context[-model.config.block_size + n_tokens :], n_tokens)


@dataclass(frozen=True)
class MemorisationResult:
    rate: float  # fraction of texts whose suffix the model reproduced exactly
    matched_tokens: float  # mean fraction of suffix tokens right (a softer view of the same)


def memorisation(model: GPT, texts: list[list[int]], prefix: int = 16, suffix: int = 8,
                 context: list[int] | None = None) -> MemorisationResult:
    """Feed each text's first ``prefix`` tokens (after an optional shared ``context``, e.g. an
    in-context example of the target style) and compare the greedy continuation with the true
    next ``suffix`` tokens."""
    exact, partial = [], []
    for ids in texts:
        if len(ids) < prefix + suffix:
            raise ValueError(f"a text of {len(ids)} tokens is shorter than prefix + suffix = {prefix + suffix}")
        got = greedy_continuation(model, (context or []) + list(ids[:prefix]), suffix)
        truth = list(ids[prefix : prefix + suffix])
        exact.append(got == truth)
        partial.append(np.mean([a == b for a, b in zip(got, truth, strict=True)]))
    return MemorisationResult(float(np.mean(exact)), float(np.mean(partial)))


# --- memorisation: canaries and exposure -------------------------------------------------------


@torch.no_grad()
def sequence_logprobs(model: GPT, prefix: list[int], candidates: list[list[int]], chunk: int = 512) -> torch.Tensor:
    """Log-probability of each candidate continuation (all the same length) after ``prefix``,
    scored ``chunk`` candidates per forward pass."""
    model.eval()
    rows, start, out = torch.tensor([prefix + c for c in candidates]), len(prefix) - 1, []
    for part in rows.split(chunk):
        logp = log_probs(model(part[:, :-1]))
        out.append(logp[:, start:].gather(-1, part[:, start + 1 :].unsqueeze(-1)).squeeze(-1).sum(-1))
    return torch.cat(out)


def exposure(model: GPT, prefix: list[int], secret: list[int], others: list[list[int]]) -> float:
    """Carlini et al.'s exposure: ``log2(#candidates) - log2(rank of the secret)`` when the secret
    and ``others`` (random candidates of the same form) are ranked by the model's likelihood.
    About 1 for a secret the model has not seen; ``log2(#candidates)`` when it ranks first."""
    scores = sequence_logprobs(model, prefix, [secret, *others])
    rank = 1 + int((scores[1:] > scores[0]).sum())
    return math.log2(len(others) + 1) - math.log2(rank)
