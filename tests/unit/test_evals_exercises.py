"""Module 10's exercises as a reader meets them: the skeletons in the notebook are told they are
not written yet, a reader's own answers pass, the new gates name their slips and fail a wrong
answer they have no name for, and the notebook (the SAEs, speculative sampling, the find-out and
three GRPO steps) goes on with the reader's code once it passes."""

import math

import numpy as np
import pytest
import torch

from posttrainllm import rl, sae, speculative
from posttrainllm.solutions import evals as solutions
from posttrainllm.tools import mastery, record
from tests.conftest import ROOT
from tests.exercises import (
    assert_readers_answers_pass_and_only_they_are_recorded,
    assert_skeletons_are_not_written_yet,
    run_cells,
    run_with_answers,
)

NOTEBOOK = ROOT / "notebooks" / "10-evals-and-interpretability.ipynb"
CALLS = {"sae_step": "check_sae_step(sae_step)", "verify": "check_verify(verify)",
         "expected_tokens": "check_expected_tokens(expected_tokens", "alpha_for": "check_alpha_for(alpha",
         "group_advantages": "check_group_advantages(group_advantages)", "grpo_loss": "check_grpo_loss(grpo_loss)",
         "mcnemar_p": "check_mcnemar_p(mcnemar_p)"}
FUNCTIONS = {"sae_step": "sae_step", "verify": "verify", "expected_tokens": "expected_tokens",
             "group_advantages": "group_advantages", "grpo_loss": "grpo_loss", "mcnemar_p": "mcnemar_p"}

# A reader's answers, written apart from the book's: the cells they type.
READER = {
    "sae_step": '''
def sae_step(sae, x, l1, optimizer):
    x_hat, f = sae(x)
    error = ((x_hat - x) ** 2).sum(dim=1).mean()
    penalty = (f * torch.linalg.vector_norm(sae.W_dec, dim=0)).sum(dim=1).mean()
    loss = error + l1 * penalty
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


mastery.check_sae_step(sae_step)
''',
    "verify": '''
def verify(p, q, token, u):
    if u < p[token] / q[token]:
        return True, None
    left = np.clip(p - q, 0, None)
    return False, left / np.sum(left)


mastery.check_verify(verify)
''',
    "expected_tokens": '''
def expected_tokens(alpha, k):
    return float(sum(alpha**i for i in range(k + 1)))


mastery.check_expected_tokens(expected_tokens, measured)
''',
    "alpha_for": '''
grid = np.linspace(0, 1, 100_001)
alpha = float(grid[np.argmin([abs(expected_tokens(a, 4) - 3.0) for a in grid])])

mastery.check_alpha_for(alpha, k=4, tokens=3.0)
''',
    "group_advantages": '''
def group_advantages(rewards):
    mean = rewards.mean(dim=1, keepdim=True)
    spread = ((rewards - mean) ** 2).mean(dim=1, keepdim=True).sqrt()
    return (rewards - mean) / (spread + 1e-6)


mastery.check_group_advantages(group_advantages)
''',
    "grpo_loss": '''
def grpo_loss(new, old, ref, mask, advantages, clip, kl_coef):
    ratio = (new - old).exp()
    a = advantages.unsqueeze(1)
    surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    kl = (ref - new).exp() - (ref - new) - 1
    per_token = surrogate - kl_coef * kl
    return -(per_token * mask).sum() / mask.sum()


mastery.check_grpo_loss(grpo_loss)
''',
    "mcnemar_p": '''
import math


def mcnemar_p(first, second):
    b = int(np.sum(first & ~second))
    c = int(np.sum(second & ~first))
    if b + c == 0:
        return 1.0
    tail = sum(math.comb(b + c, i) for i in range(min(b, c) + 1)) / 2 ** (b + c)
    return min(1.0, 2 * tail)


mastery.check_mcnemar_p(mcnemar_p)
''',
}


def _run(sources: list[str]) -> dict:
    return run_cells(sources, torch=torch, np=np, math=math, measured={})


def test_each_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet():
    assert_skeletons_are_not_written_yet(NOTEBOOK, CALLS, FUNCTIONS, _run)


def test_a_readers_own_answers_pass_are_recorded_and_the_books_are_not():
    assert_readers_answers_pass_and_only_they_are_recorded(FUNCTIONS, solutions, READER, _run)


ADVANTAGE_SLIPS = [("((rewards - mean) ** 2).mean(dim=1, keepdim=True).sqrt()", "rewards.std(dim=1, keepdim=True)",
                    "population std"),
                   ("return (rewards - mean) / (spread + 1e-6)", "return rewards - mean", "divide the centred"),
                   ("return (rewards - mean) / (spread + 1e-6)",
                    "return (rewards - rewards.mean()) / (spread + 1e-6)", "its own group's mean")]
LOSS_SLIPS = [("return -(per_token * mask).sum() / mask.sum()", "return (per_token * mask).sum() / mask.sum()",
               "minus the objective"),
              ("surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)",
               "surrogate = ratio.clamp(1 - clip, 1 + clip) * a", "take the minimum"),
              ("surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)", "surrogate = ratio * a",
               "clip the ratio"),
              ("per_token = surrogate - kl_coef * kl", "per_token = surrogate + kl_coef * kl", "subtract the KL"),
              ("kl = (ref - new).exp() - (ref - new) - 1", "kl = new - ref", "the k3 estimate"),
              ("return -(per_token * mask).sum() / mask.sum()", "return -per_token.mean()", "only the tokens in"),
              ("return -(per_token * mask).sum() / mask.sum()",
               "return -((per_token * mask).sum(1) / mask.sum(1)).mean()", "the token mean")]


MCNEMAR_SLIPS = [("return min(1.0, 2 * tail)", "return tail", "double the smaller tail"),
                 ("return min(1.0, 2 * tail)", "return 2 * tail", "cap twice the tail at 1"),
                 ("range(min(b, c) + 1)", "range(min(b, c))", "includes the observed split"),
                 ("    tail = sum(math.comb(b + c, i) for i in range(min(b, c) + 1)) / 2 ** (b + c)",
                  "    tail = sum(math.comb(len(first), i) for i in range(min(b, c) + 1)) / 2 ** len(first)",
                  "only the questions the two disagree on")]


@pytest.mark.parametrize(("gate", "old", "new", "named"), [("group_advantages", *s) for s in ADVANTAGE_SLIPS] +
                         [("grpo_loss", *s) for s in LOSS_SLIPS] + [("mcnemar_p", *s) for s in MCNEMAR_SLIPS])
def test_each_slip_is_named(gate, old, new, named):
    assert old in READER[gate]
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[FUNCTIONS[gate]])
    assert not result and named in repr(result), repr(result)


@pytest.mark.parametrize(("gate", "old", "new"), [
    ("group_advantages", "(spread + 1e-6)", "(spread + 1e-6) * 1.1"),
    ("grpo_loss", "per_token = surrogate - kl_coef * kl", "per_token = surrogate - 2 * kl_coef * kl"),
    ("mcnemar_p", "return min(1.0, 2 * tail)", "return min(1.0, 3 * tail)"),
])
def test_a_wrong_answer_the_gate_has_no_name_for_still_fails(gate, old, new):
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[FUNCTIONS[gate]])
    assert not result and not result.first and " -- " not in repr(result), repr(result)


def test_a_unanimous_group_without_the_epsilon_is_a_failure_that_says_which_group():
    result = mastery.check_group_advantages(_run([READER["group_advantages"].replace(
        "(spread + 1e-6)", "spread")])["group_advantages"])
    assert not result and "all equal (std 0)" in repr(result), repr(result)


def test_the_packages_pieces_are_what_the_runs_use():
    torch.set_default_dtype(torch.float64)
    try:
        model = sae.SparseAutoencoder(4, 8, seed=0)
        twin = sae.SparseAutoencoder(4, 8, seed=0)
        acts = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        plain = sae.train_sae(model, acts, steps=5, l1=0.3, batch_size=16)
        reader = _run([READER["sae_step"]])["sae_step"]
        theirs = sae.train_sae(twin, acts, steps=5, l1=0.3, batch_size=16, step=reader)
        assert np.allclose(plain, theirs, rtol=0, atol=1e-12)
    finally:
        torch.set_default_dtype(torch.float32)
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert speculative.verify(p, q, 0, 0.99) == (True, None)
    kept, replacement = speculative.verify(p, q, 2, 0.9)
    assert not kept and np.allclose(replacement, [1.0, 0.0, 0.0])
    new, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -1.5]])
    assert torch.allclose(rl.k3(new, ref), torch.tensor([[0.0, math.exp(0.5) - 1.5]]))


def test_a_given_objective_must_leave_the_aggregation_and_the_upper_clip_alone():
    with pytest.raises(ValueError, match="token mean with one clip range"):
        rl.train_grpo(None, None, None, [], rl.composite, steps=1, clip_high=0.28, objective=solutions.grpo_loss)
    with pytest.raises(ValueError, match="decides the normalisation itself"):
        rl.train_grpo(None, None, None, [], rl.composite, steps=1, normalise=False,
                      advantage=solutions.group_advantages)


@pytest.mark.slow
@pytest.mark.serial
def test_the_notebook_goes_on_with_the_readers_code_once_it_passes():
    # up to the GRPO runs, the last cell before the continual-learning cycle that runs the reader's code (that
    # cycle trains for 47 s and runs only their McNemar test); the canary, memorisation and greedy speculative
    # runs (a minute and a half, none of it the reader's) stand in as the figures the notebook stored
    given = {"def story_tokens(": "pass", "styled = lora.inject(": "pass",
             "reference = [evals.greedy_continuation(": (
                 "target, draft = base_model(SPECULATIVE_TARGET)[0], base_model(SPECULATIVE_DRAFT)[0]\n"
                 "prompts = [list(val_ids[i * 97 : i * 97 + 12]) for i in range(20)]\n"
                 "measured = {1: (0.898, 1.87), 2: (0.906, 2.65), 4: (0.914, 4.03)}  # stored by the notebook")}
    everything = run_with_answers(NOTEBOOK, READER, CALLS, until="small_q = sft.examples(", given=given)
    trained_with = ("sae_step", "verify", "group_advantages", "grpo_loss", "mcnemar_p")
    for name in trained_with:
        assert f"Your {name} passed its gate: the cells below run yours." in everything
    assert "the book's rule on the same draws gives the same tokens: True" in everything
    assert "the book's run took the same 3 steps: True" in everything
    assert "PASSED alpha_for: your answer matches." in everything
    assert record.load() == {*FUNCTIONS, "alpha_for"}
