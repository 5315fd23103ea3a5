"""Module 10: reinforcement learning from verifiable rewards — GRPO (Shao et al., 2024).

For each prompt, sample a *group* of ``G`` completions from the policy and score each with a
reward function. A completion's **advantage** is its reward minus the group's mean, divided by
the group's standard deviation: better than its siblings means positive, whatever the reward's
scale, and no value network is needed. The policy then maximises the PPO-style clipped objective
``min(r A, clip(r, 1 - eps, 1 + eps) A)`` per token, with ``r`` the probability ratio between the
current policy and the one that sampled, minus ``beta`` times a KL penalty to a frozen reference
(the k3 estimator ``e^(ref - new) - (ref - new) - 1``, never negative).

Published variants are switches: ``clip_high`` is DAPO's clip-higher (Yu et al., 2025), a
wider upper clip so rare good tokens can gain probability faster; ``normalise=False`` is Dr.
GRPO's advantage (Liu et al., 2025), without the division by the group's std, which otherwise
makes near-unanimous groups count as much as contested ones. How the per-token terms of a group
become one loss is a named choice too (:func:`aggregate`): the book's default is DAPO's token-level
mean; the GRPO paper's per-response mean and Dr. GRPO's division by a constant are the others.

A group whose completions all score the same has zero advantage everywhere, so it teaches
nothing — the tests check exactly that.

Sampling makes GRPO chaotic: a starting point a rounding error away samples one different token
some tens of steps in, and from then on the two runs see different data. :func:`reproducible_start`
gives runs on different CPUs the same start and keeps them together.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch

from posttrainllm import evals
from posttrainllm import progress as bars
from posttrainllm.model import GPT, KVCache, log_probs
from posttrainllm.optim import AdamW
from posttrainllm.sft import END, Example, chat_ids
from posttrainllm.tokenizer import Tokenizer

Reward = Callable[[Example, "str | None"], float]  # (task example, completion or None if unfinished)


def composite(example: Example, completion: str | None) -> float:
    """The reward to learn from: the answer is right, and well formed (:func:`evals.composite_reward`)."""
    return evals.composite_reward(completion, example.response)


def phrase_of_prompt(example: Example, completion: str | None) -> float:
    """A proxy that looks reasonable and can be hacked: 1 when the answer is a phrase of the prompt
    (right answers are, but so is any other phrase of the story)."""
    return float(bool(completion and completion.strip()) and completion.strip() in example.prompt)


Advantage = Callable[[torch.Tensor], torch.Tensor]  # rewards (prompts, group) -> advantages, same shape
Objective = Callable[..., torch.Tensor]  # (new, old, ref, mask, advantages, clip, kl_coef) -> the loss

REWARDS: dict[str, Reward] = {"composite: correct + format": composite,
                              "proxy: the answer is a phrase of the prompt": phrase_of_prompt}


def reproducible_start(model: GPT, trainable_grid: float = 2.0**-8, frozen_grid: float = 2.0**-12) -> GPT:
    """A float64 copy of ``model`` with every trainable weight rounded to a multiple of
    ``trainable_grid`` and every frozen one to a multiple of ``frozen_grid``.

    Module 9's LoRA adapter comes out of float32 training up to 4e-8 apart on CPUs with different
    vector widths (its frozen base, 8e-11). GRPO from those two starts samples a different token
    by step 86 and then diverges. Rounding maps both starts to the same weights — unless a weight
    lies within that distance of a rounding boundary, which for module 9's adapter is expected
    once in about a hundred CPU pairs — and in float64 two such runs were 2e-13 apart after 100
    steps (measured at lr 1e-3), too little to flip a sampled token. The rounding moves no weight
    by more than half a grid step; module 9's adapter answered one held-out question of 400 fewer
    after it (169 -> 168), and 36 of the first 90 before and after."""
    start = copy.deepcopy(model).double()
    with torch.no_grad():
        for p in start.parameters():
            grid = trainable_grid if p.requires_grad else frozen_grid
            p.copy_(torch.round(p / grid) * grid)
    return start


def group_advantages(rewards: torch.Tensor, normalise: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Advantages for rewards of shape ``(prompts, group)``: centred on each group's mean, and
    (by default) scaled by its standard deviation.

    The std is the population one (divide by the group size ``G``), the group's own spread, as
    the GRPO paper writes it. Libraries that call ``torch.std`` get the sample std (divide by
    ``G - 1``) instead: every advantage is then smaller by ``sqrt((G - 1) / G)`` (0.866 for
    ``G = 4``), which weakens the policy-gradient term against the KL penalty by that factor."""
    centred = rewards - rewards.mean(-1, keepdim=True)
    return centred / (rewards.std(-1, keepdim=True, unbiased=False) + eps) if normalise else centred


def raw_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE's advantage (Williams, 1992): each answer's reward as it is, with no baseline."""
    return rewards


def centred(rewards: torch.Tensor) -> torch.Tensor:
    """Each reward minus its group's mean: REINFORCE with the group mean as the baseline."""
    return group_advantages(rewards, normalise=False)


# The policy-gradient ladder module 10 climbs to GRPO: each rung adds one piece to the one before,
# as settings of train_grpo. The first three take one update per batch without a KL penalty, so
# the ratio is exactly 1 and the clipped objective's gradient is the plain policy gradient.
LADDER: dict[str, dict] = {
    "REINFORCE": {"advantage": raw_rewards, "updates_per_batch": 1, "kl_coef": 0.0},
    "+ baseline: the group's mean": {"advantage": centred, "updates_per_batch": 1, "kl_coef": 0.0},
    "+ normalised by the group's std": {"advantage": group_advantages, "updates_per_batch": 1, "kl_coef": 0.0},
    "+ clipped ratio, 2 updates a batch": {"advantage": group_advantages, "updates_per_batch": 2, "kl_coef": 0.0},
    "+ KL penalty (k3, 0.04): GRPO": {"advantage": group_advantages, "updates_per_batch": 2, "kl_coef": 0.04},
}


def policy_gradients(policy: GPT, tokenizer: Tokenizer, prompts: list[Example], reward: Reward,
                     advantages: dict[str, Advantage], draws: int, prompts_per_step: int = 8, group_size: int = 8,
                     temperature: float = 1.0, max_tokens: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """``draws`` independent estimates of the policy gradient at ``policy`` (its trainable
    parameters, flattened), for each advantage function in ``advantages``: shape ``(draws, n)``
    each. Every draw samples one batch as a GRPO step does and uses it for all the advantage
    functions, so they are compared on the same answers; nothing is updated."""
    trainable = [p for p in policy.parameters() if p.requires_grad]
    pad = tokenizer.special_tokens[END]
    generator, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    out: dict[str, list[torch.Tensor]] = {name: [] for name in advantages}
    policy.eval()
    for _ in range(draws):
        batch = []
        for index in rng.choice(len(prompts), prompts_per_step, replace=False):
            example = prompts[index]
            groups = sample_group(policy, tokenizer, example.prompt, group_size, max_tokens, temperature, generator)
            batch.append((chat_ids(tokenizer, example.prompt), groups,
                          [reward(example, completion_text(tokenizer, c)) for c in groups]))
        rewards = torch.tensor([b[2] for b in batch])
        for name, advantage in advantages.items():
            adv = advantage(rewards)
            losses = []
            for (prompt, groups, _), a in zip(batch, adv, strict=True):
                new, mask = token_logprobs(policy, prompt, groups, pad)
                losses.append(-masked_mean(new * a[:, None], mask))  # the objective's gradient at ratio 1
            grads = torch.autograd.grad(torch.stack(losses).mean(), trainable)
            out[name].append(torch.cat([g.reshape(-1) for g in grads]))
    return {name: torch.stack(found) for name, found in out.items()}


def gradient_noise(estimates: torch.Tensor) -> float:
    """How noisy gradient estimates of shape ``(draws, n)`` are against the signal they share:
    the mean squared distance from their mean over the squared norm of their mean. Above 1, one
    estimate is mostly noise; the baseline and the normalisation exist to bring it down."""
    if estimates.ndim != 2 or len(estimates) < 2:
        raise ValueError(f"need at least two estimates in rows of shape (draws, n), got {tuple(estimates.shape)}")
    mean = estimates.mean(0)
    return float(((estimates - mean) ** 2).sum(1).mean() / (mean**2).sum())


@torch.no_grad()
def sample_group(model: GPT, tokenizer: Tokenizer, prompt: str, size: int, max_tokens: int,
                 temperature: float, generator: torch.Generator) -> list[list[int]]:
    """``size`` completions of one prompt, sampled together as a batch through one KV cache. A
    completion that ends with the end token is finished; one that runs out of tokens is not."""
    model.eval()
    end = tokenizer.special_tokens[END]
    ids = chat_ids(tokenizer, prompt)
    cache = KVCache(model.config.n_layer)
    logits = model(torch.tensor([ids] * size), cache=cache)[:, -1]
    out: list[list[int]] = [[] for _ in range(size)]
    done = torch.zeros(size, dtype=torch.bool)
    for _ in range(min(max_tokens, model.config.block_size - len(ids))):
        tokens = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        for g in torch.nonzero(~done)[:, 0].tolist():
            out[g].append(int(tokens[g]))
        done |= tokens == end
        if done.all() or cache.length >= model.config.block_size:
            break
        logits = model(tokens[:, None], cache=cache)[:, -1]
    return out


def completion_text(tokenizer: Tokenizer, tokens: list[int]) -> str | None:
    """The completion as text, or ``None`` if it never produced the end token (truncated)."""
    end = tokenizer.special_tokens[END]
    return tokenizer.decode(tokens[:-1]) if tokens and tokens[-1] == end else None


def token_logprobs(model: GPT, prompt: list[int], completions: list[list[int]], pad: int):
    """``(log-probs, mask)`` of each completion's tokens, shape ``(n, longest)``."""
    picked, mask, _ = _completion_logprobs(model, prompt, completions, pad)
    return picked, mask


def _completion_logprobs(model: GPT, prompt: list[int], completions: list[list[int]], pad: int):
    """:func:`token_logprobs` and the policy's entropy at each of those positions, from one forward."""
    width = max(len(c) for c in completions)
    rows = torch.tensor([prompt + c + [pad] * (width - len(c)) for c in completions])
    logits = model(rows[:, :-1])[:, len(prompt) - 1 :]
    picked = log_probs(logits).gather(-1, rows[:, len(prompt) :].unsqueeze(-1)).squeeze(-1)
    mask = torch.tensor([[1.0] * len(c) + [0.0] * (width - len(c)) for c in completions])
    return picked, mask, token_entropy(logits)


AGGREGATIONS = ("token", "sequence", "constant")


def _checked(values: torch.Tensor, mask: torch.Tensor) -> None:
    if values.shape != mask.shape:
        raise ValueError(f"values of shape {tuple(values.shape)} and a mask of shape {tuple(mask.shape)}: "
                         "one mask entry per token is needed")
    if not mask.any():
        raise ValueError("the mask selects no token: there is nothing to average")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The mean of ``values`` over the entries where ``mask`` is 1: all of them, or along ``dim``
    (where every row must keep at least one entry)."""
    _checked(values, mask)
    if dim is None:
        return (values * mask).sum() / mask.sum()
    counts = mask.sum(dim)
    if not counts.all():
        raise ValueError(f"a row of the mask selects no token along dim {dim}: an empty response has no mean")
    return (values * mask).sum(dim) / counts


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str = "token", max_tokens: int | None = None):
    """One number from per-token terms of shape ``(responses, T)`` over the tokens in ``mask``.

    - ``"token"``: the sum over every token of the group divided by their number (DAPO, Yu et al.
      2025): each token weighs the same, so a long response counts more than a short one.
    - ``"sequence"``: each response's mean over its own tokens, then the mean over responses (the
      GRPO paper, Shao et al. 2024, eq. 3): each response weighs the same, so a token of a short
      response counts more than one of a long response.
    - ``"constant"``: the sum divided by ``responses * max_tokens``, a constant that does not depend
      on the lengths (Dr. GRPO, Liu et al. 2025), so no length is rewarded by the averaging itself.
    """
    if how == "token":
        return masked_mean(per_token, mask)
    if how == "sequence":
        return masked_mean(per_token, mask, dim=-1).mean()
    if how == "constant":
        if not max_tokens or max_tokens < per_token.shape[-1]:
            raise ValueError(f"the constant aggregation divides by the generation budget: give max_tokens >= "
                             f"{per_token.shape[-1]}, the longest response here, got {max_tokens!r}")
        _checked(per_token, mask)
        return (per_token * mask).sum() / (per_token.shape[0] * max_tokens)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy in nats of the next-token distribution at each position, shape ``logits.shape[:-1]``."""
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def grpo_loss(new: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
              clip: float = 0.2, clip_high: float | None = None, kl_coef: float = 0.04, aggregation: str = "token",
              max_tokens: int | None = None):
    """``(loss, mean KL)`` over the completion tokens in ``mask``; ``advantages`` has one value per
    completion (shape ``(n,)``); :func:`aggregate` says how the tokens' terms become one loss."""
    ratio = torch.exp(new - old)
    a = advantages[:, None]
    objective = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + (clip_high or clip)) * a)
    kl = k3(new, ref)
    return -aggregate(objective - kl_coef * kl, mask, aggregation, max_tokens), masked_mean(kl, mask).detach()


def k3(new: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per token, the k3 estimate of KL(policy || reference) from the two log-probabilities of the
    sampled token: ``e^(ref - new) - (ref - new) - 1``, never negative, unbiased under sampling."""
    return torch.exp(ref - new) - (ref - new) - 1


def train_grpo(policy: GPT, reference: GPT, tokenizer: Tokenizer, prompts: list[Example], reward: Reward,
               steps: int, prompts_per_step: int = 8, group_size: int = 8, lr: float = 1e-3, kl_coef: float = 0.04,
               clip: float = 0.2, clip_high: float | None = None, normalise: bool = True, updates_per_batch: int = 2,
               temperature: float = 1.0, max_tokens: int = 12, seed: int = 0, track: Reward | None = None,
               aggregation: str = "token", advantage: Advantage | None = None,
               objective: Objective | None = None) -> dict:
    """GRPO on the policy's trainable parameters. Returns per step the mean reward, the mean KL to
    the reference, the mean of ``track`` (e.g. true correctness when training on a proxy), the
    sampling policy's mean token entropy in nats and the answers' mean length in tokens.
    ``aggregation`` is :func:`aggregate`'s choice (``"constant"`` divides by ``max_tokens``).

    Module 10's reader writes the two pieces of the objective: ``advantage(rewards)`` in place of
    :func:`group_advantages`, and ``objective(new, old, ref, mask, advantages, clip, kl_coef)`` in
    place of :func:`grpo_loss` with its defaults (the token mean, one clip range)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if objective is not None and (aggregation != "token" or clip_high is not None):
        raise ValueError("a given objective takes the token mean with one clip range: "
                         "leave aggregation and clip_high at their defaults")
    if advantage is not None and not normalise:
        raise ValueError("a given advantage function decides the normalisation itself: leave normalise=True")
    pad = tokenizer.special_tokens[END]
    optimizer = AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    history: dict = {"reward": [], "kl": [], "tracked": [], "entropy": [], "length": []}
    reference.eval()
    for _ in bars.steps(steps, "RL"):
        batch = []
        for index in rng.choice(len(prompts), prompts_per_step, replace=False):
            example = prompts[index]
            groups = sample_group(policy, tokenizer, example.prompt, group_size, max_tokens, temperature, generator)
            texts = [completion_text(tokenizer, c) for c in groups]
            batch.append((example, groups, texts, torch.tensor([reward(example, t) for t in texts])))
        rewards = torch.stack([b[3] for b in batch])
        advantages = advantage(rewards) if advantage else group_advantages(rewards, normalise)
        with torch.no_grad():
            policy.eval()
            sampled = [_completion_logprobs(policy, chat_ids(tokenizer, e.prompt), g, pad) for e, g, _, _ in batch]
            olds = [logp for logp, _, _ in sampled]
            refs = [token_logprobs(reference, chat_ids(tokenizer, e.prompt), g, pad)[0] for e, g, _, _ in batch]
        policy.train()
        for _ in range(updates_per_batch):
            losses, kls = [], []
            for (example, groups, _, _), old, ref, adv in zip(batch, olds, refs, advantages, strict=True):
                new, mask = token_logprobs(policy, chat_ids(tokenizer, example.prompt), groups, pad)
                if objective is None:
                    loss, kl = grpo_loss(new, old, ref, mask, adv, clip, clip_high, kl_coef, aggregation, max_tokens)
                else:
                    loss = objective(new, old, ref, mask, adv, clip, kl_coef)
                    kl = masked_mean(k3(new, ref), mask).detach()
                losses.append(loss)
                kls.append(kl)
            optimizer.zero_grad(set_to_none=True)
            torch.stack(losses).mean().backward()
            optimizer.step()
        history["reward"].append(rewards.mean().item())
        # what practitioners watch besides the reward: the sampling policy's mean token entropy (a
        # collapse to one answer shows here first) and the answers' mean length in tokens
        entropy = sum((h * m).sum() for _, m, h in sampled) / sum(m.sum() for _, m, _ in sampled)
        history["entropy"].append(entropy.item())
        history["length"].append(float(np.mean([len(c) for _, groups, _, _ in batch for c in groups])))
        history["kl"].append(torch.stack(kls).mean().item())
        if track is not None:
            history["tracked"].append(float(np.mean([track(e, t) for e, _, texts, _ in batch for t in texts])))
    policy.eval()
    return history
