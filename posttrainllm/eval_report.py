"""The eval matrix of the book's models and the public report generated from it (the evals and
failure-analysis chapter, ``book/evals-and-failures.md``).

Each model is scored on the same 300 held-out questions three ways — its greedy answer (exact
match), which of the task's candidate answers it finds most likely (a multiple-choice reading of
the same questions), and its perplexity on held-out stories — and every wrong answer is kept for
the error taxonomy (:mod:`posttrainllm.failures`). :func:`model_card` writes one model's report
in the shape Mitchell et al. proposed (*Model Cards for Model Reporting*, 2019): what the model
is, what it was evaluated on, the scores with their intervals, where it fails, and the caveats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posttrainllm import comparison, failures
from posttrainllm.model import GPT, log_probs
from posttrainllm.sft import END, Example, chat_ids
from posttrainllm.tokenizer import Tokenizer
from posttrainllm.train import greedy


def answer(model: GPT, tokenizer: Tokenizer, prompt: str, max_tokens: int = 16) -> str | None:
    """The greedy answer, or ``None`` if the model did not end it within ``max_tokens`` tokens."""
    ids = chat_ids(tokenizer, prompt)
    room = min(max_tokens, model.config.block_size - len(ids))
    out = greedy(model, ids, room, stop=tokenizer.special_tokens[END])
    return None if len(out) == room else tokenizer.decode(out)


@torch.no_grad()
def choice(model: GPT, tokenizer: Tokenizer, prompt: str, candidates: list[str]) -> str:
    """The candidate (followed by the end token) to which the model gives the most probability."""
    end, context = tokenizer.special_tokens[END], chat_ids(tokenizer, prompt)
    rows = [context + tokenizer.encode_ordinary(c) + [end] for c in candidates]
    width = max(map(len, rows))
    idx = torch.tensor([r + [end] * (width - len(r)) for r in rows])
    logp = log_probs(model(idx[:, :-1])).gather(-1, idx[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = torch.tensor([[len(context) - 1 <= t < len(r) - 1 for t in range(width - 1)] for r in rows])
    return candidates[int((logp * mask).sum(-1).argmax())]


@dataclass
class Evaluation:
    name: str
    answers: list[str | None]
    right: np.ndarray  # exact match, per question
    choice_right: np.ndarray  # the most likely candidate is the right one, per question
    perplexity: float  # on held-out stories


def evaluate(name: str, model: GPT, tokenizer: Tokenizer, questions: list[Example], perplexity: float) -> Evaluation:
    answers = [answer(model, tokenizer, q.prompt) for q in questions]
    right = np.array([a is not None and a.strip() == q.response for a, q in zip(answers, questions, strict=True)])
    picks = [choice(model, tokenizer, q.prompt, sorted(failures.ANSWERS[failures.question_kind(q.prompt)]))
             for q in questions]
    choice_right = np.array([p == q.response for p, q in zip(picks, questions, strict=True)])
    return Evaluation(name, answers, right, choice_right, perplexity)


def holm(p_values: dict) -> dict:
    """Holm's step-down adjustment (1979): p-values that can be compared with alpha as a family."""
    order = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for rank, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[key]))
        adjusted[key] = running
    return adjusted


def bootstrap_difference(a: np.ndarray, b: np.ndarray, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval for ``mean(a) - mean(b)``, ``a`` and ``b`` independent samples."""
    rng = np.random.default_rng(seed)
    diffs = rng.choice(a, (draws, a.size)).mean(1) - rng.choice(b, (draws, b.size)).mean(1)
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def stratified_difference(right: np.ndarray, group: np.ndarray, strata: np.ndarray, draws: int = 4000,
                          seed: int = 0) -> tuple[float, float, float]:
    """``(estimate, low, high)``: the difference in mean ``right`` between ``group`` and the rest,
    taken within each stratum and averaged with the strata's sizes as weights, so that a stratum
    that is both easier and more common in one group cannot make the difference up; the 95%
    interval resamples within every (stratum, group) cell. Strata lacking either group are skipped."""
    rng = np.random.default_rng(seed)
    cells = [(right[(strata == s) & group].astype(float), right[(strata == s) & ~group].astype(float))
             for s in np.unique(strata)]
    cells = [(a, b) for a, b in cells if a.size and b.size]
    weights = np.array([a.size + b.size for a, b in cells], dtype=float)
    weights /= weights.sum()
    estimate = float(sum(w * (a.mean() - b.mean()) for w, (a, b) in zip(weights, cells, strict=True)))
    boot = sum(w * (rng.choice(a, (draws, a.size)).mean(1) - rng.choice(b, (draws, b.size)).mean(1))
               for w, (a, b) in zip(weights, cells, strict=True))
    return estimate, float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def model_card(evaluation: Evaluation, description: str, questions: list[Example], dirty: np.ndarray) -> str:
    """One model's report as Markdown, every figure computed from ``evaluation``."""
    e, n = evaluation, len(questions)
    low, high = comparison.wilson_interval(int(e.right.sum()), n)
    c_low, c_high = comparison.wilson_interval(int(e.choice_right.sum()), n)
    counts = failures.taxonomy([q.prompt for q in questions], e.answers, [q.response for q in questions])
    top = ", ".join(f"{category} ({count})" for category, count in counts.most_common(3)) or "none"
    clean, overlap = e.right[~dirty], e.right[dirty]
    return "\n".join([
        f"### {e.name}", "",
        f"**Model.** {description}", "",
        "**Intended use.** Answering what / where / who questions about a one-sentence story in the "
        "book's templated English, for teaching. Not for any other text.", "",
        f"**Evaluation.** {n} held-out questions (new stories, new pairs of names), greedy decoding, exact match.", "",
        "| metric | score | 95% interval |", "| --- | --- | --- |",
        f"| exact match | {e.right.mean():.1%} | {low:.1%} to {high:.1%} |",
        f"| most likely candidate is right | {e.choice_right.mean():.1%} | {c_low:.1%} to {c_high:.1%} |",
        f"| perplexity on held-out stories | {e.perplexity:.3f} | |", "",
        f"**Failures.** {n - int(e.right.sum())} wrong answers; most common: {top}.", "",
        f"**Caveats.** {int(dirty.sum())} of the {n} questions share a 13-gram with the fine-tuning data "
        f"(the templates repeat sentences): exact match {overlap.mean():.1%} on those, {clean.mean():.1%} "
        "on the rest. Small test set: differences of a few points between models are not evidence unless "
        "a paired test says so.",
    ])
