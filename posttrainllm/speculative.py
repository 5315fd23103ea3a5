"""Module 10: speculative decoding (Leviathan et al., 2023) — a small draft proposes, the target
verifies several tokens in one forward pass, and the output is distributed exactly as if the
target had sampled alone.

Each round: the draft proposes ``k`` tokens one at a time; the target scores all of them in
**one** forward over ``k + 1`` positions (its KV cache makes that one call). Draft token ``i`` is
kept with probability ``min(1, p_i / q_i)`` (``p`` the target's probability, ``q`` the draft's);
at the first rejection a replacement is drawn from ``max(0, p - q)`` renormalised, and the round
ends; if all ``k`` survive, a bonus token comes from the target's last position. That accept /
resample rule is what makes the result *lossless*. Greedy decoding is the special case where a
draft token survives iff it is the target's argmax.

"Seed-carry": the last token of a round is not fed to the target at once; it goes in as the
first position of the next verify, so no round spends a target forward on one token. Rejected
tokens are cropped out of both KV caches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from posttrainllm.device import borrowed
from posttrainllm.model import GPT, KVCache

# judges one draft token: (p, q, token, u) -> (kept, the distribution to resample from or None)
Rule = Callable[[np.ndarray, np.ndarray, int, float], tuple[bool, "np.ndarray | None"]]


@dataclass
class SpecStats:
    tokens: list[int] = field(default_factory=list)  # generated tokens (the prompt excluded)
    target_forwards: int = 0
    draft_forwards: int = 0
    considered: int = 0  # draft tokens the target judged (those after a rejection are not)
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        """Estimate of alpha: the fraction of judged draft tokens that were kept."""
        return self.accepted / max(1, self.considered)

    @property
    def tokens_per_target_forward(self) -> float:
        return len(self.tokens) / max(1, self.target_forwards)


def expected_tokens_per_forward(alpha: float, k: int) -> float:
    """Leviathan et al.'s ``(1 - alpha^(k+1)) / (1 - alpha)``: tokens per target forward when each
    draft token is accepted independently with probability ``alpha``."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def _probs(logits: torch.Tensor, temperature: float) -> np.ndarray:
    return torch.softmax(logits.double() / temperature, dim=-1).cpu().numpy()


def _feed(model: GPT, cache: KVCache, sequence: list[int], extra: list[int] = ()) -> torch.Tensor:
    """Run the tokens the cache has not seen yet (plus ``extra``); return their logits."""
    new = sequence[cache.length :] + list(extra)
    return model(torch.tensor([new], device=model.head.weight.device), cache=cache)[0]


@torch.no_grad()
def speculative_generate(target: GPT, draft: GPT, prompt: list[int], max_new: int, k: int = 4,
                         temperature: float = 0.0, rng: np.random.Generator | None = None,
                         device: str | None = None, rule: Rule | None = None) -> SpecStats:
    """Generate up to ``max_new`` tokens after ``prompt``; ``temperature=0`` is greedy. Both models
    run on ``device``, borrowed for the call (see :func:`device.borrowed`; by default where the
    target is). When sampling, ``rule`` judges each draft token (:func:`verify` by default;
    module 10's reader writes one)."""
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError("the draft and the target must share one vocabulary")
    if temperature > 0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs an rng")
    with borrowed(target, device) as device, borrowed(draft, device):
        return _speculate(target, draft, list(prompt), max_new, k, temperature, rng, device, rule or verify)


def _speculate(target: GPT, draft: GPT, seq: list[int], max_new: int, k: int, temperature: float,
               rng: np.random.Generator | None, device: str, rule: Rule) -> SpecStats:
    target.eval()
    draft.eval()
    limit = min(target.config.block_size, draft.config.block_size)
    stats = SpecStats()
    t_cache, d_cache = KVCache(target.config.n_layer), KVCache(draft.config.n_layer)
    while len(stats.tokens) < max_new and len(seq) < limit:
        # propose fewer near the end: never past max_new, never past the context window
        k_now = min(k, max_new - len(stats.tokens) - 1, limit - len(seq))
        proposed, q = [], []
        if k_now:
            logits = _feed(draft, d_cache, seq)[-1]
            stats.draft_forwards += 1
        for i in range(k_now):
            q.append(_probs(logits, temperature) if temperature > 0 else None)
            token = int(rng.choice(len(q[-1]), p=q[-1])) if temperature > 0 else int(logits.argmax())
            proposed.append(token)
            if i < k_now - 1:
                logits = draft(torch.tensor([[token]], device=device), cache=d_cache)[0, -1]
                stats.draft_forwards += 1
        # ONE target forward over [newest token, *proposed]: row i judges proposed[i], row k_now
        # is the position after them all
        scores = _feed(target, t_cache, seq, proposed)[-(k_now + 1) :]
        stats.target_forwards += 1
        kept = _judge(scores, proposed, q, temperature, rng, rule)
        stats.considered += min(len(kept), len(proposed))
        stats.accepted += len(kept) - 1
        seq += kept
        stats.tokens += kept
        # drop what the caches saw of rejected proposals; the newest token is carried to the next verify
        t_cache.crop(len(seq) - 1)
        d_cache.crop(min(d_cache.length, len(seq) - 1))
    return stats


def accepts(p: np.ndarray, q: np.ndarray, token: int, u: float) -> bool:
    """Keep a draft token with probability ``min(1, p[token] / q[token])``, given ``u ~ U[0, 1)``."""
    return u < min(1.0, p[token] / q[token])


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Where a rejected token's replacement is drawn from: ``max(0, p - q)``, renormalised. With
    the acceptance rule it makes the output distributed exactly as ``p``."""
    leftover = np.maximum(p - q, 0)
    return leftover / leftover.sum()


def verify(p: np.ndarray, q: np.ndarray, token: int, u: float) -> tuple[bool, np.ndarray | None]:
    """The rule for one draft ``token``: ``(True, None)`` when it is kept (:func:`accepts`), else
    ``(False, r)`` with ``r`` the distribution its replacement is drawn from (:func:`residual`)."""
    return (True, None) if accepts(p, q, token, u) else (False, residual(p, q))


def _judge(scores: torch.Tensor, proposed: list[int], q: list, temperature: float, rng, rule: Rule) -> list[int]:
    """The tokens a round keeps: the accepted prefix of ``proposed``, then one more — the
    resampled replacement at the first rejection, or the bonus token if none was rejected."""
    kept = []
    for i, token in enumerate(proposed):
        if temperature == 0:
            best = int(scores[i].argmax())
            if best != token:
                return kept + [best]
        else:
            p = _probs(scores[i], temperature)
            accepted, replacement = rule(p, q[i], token, rng.random())
            if not accepted:
                return kept + [int(rng.choice(len(p), p=replacement))]
        kept.append(token)
    last = scores[len(proposed)]
    bonus = int(last.argmax()) if temperature == 0 else int(rng.choice(len(last), p=_probs(last, temperature)))
    return kept + [bonus]


@torch.no_grad()
def first_divergence(target: GPT, prompt: list[int], a: list[int], b: list[int]) -> tuple[int, float] | None:
    """Where two greedy decodes of ``target`` first differ, and the target's gap between its top
    two logits there, recomputed without a cache. A gap near float rounding (~1e-6) means batched
    and one-token attention summed in a different order and flipped a near tie — both decodes
    are valid greedy decodes; a large gap would be a bug."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            logits = target(torch.tensor([prompt + a[:i]]))[0, -1]
            top2 = logits.topk(2).values
            return i, float(top2[0] - top2[1])
    return None
