"""Module 9's exercises as a reader meets them: the skeletons in the notebook are told they are
not written yet, a reader's own answers pass, the new gates name their slips and fail a wrong
answer they have no name for, and the notebook (SFT targets, the LoRA layer and its merge, and a
DPO run) goes on with the reader's code once it passes."""

import pytest
import torch

from posttrainllm import preference, sft
from posttrainllm.solutions import behaviour as solutions
from posttrainllm.tools import mastery
from tests.conftest import ROOT
from tests.exercises import (
    assert_readers_answers_pass_and_only_they_are_recorded,
    assert_skeletons_are_not_written_yet,
    run_cells,
    run_with_answers,
)

NOTEBOOK = ROOT / "notebooks" / "09-behaviour-learning.ipynb"
CALLS = {"sft_targets": "check_sft_targets(sft_targets)", "lora_forward": "check_lora_forward(lora_forward)",
         "lora_merge": "check_lora_merge(merge)", "response_logprob": "check_response_logprob(response_logprob)",
         "dpo_loss": "check_dpo_loss(dpo_loss)", "energy_rank": "check_energy_rank(rank"}
FUNCTIONS = {"sft_targets": "sft_targets", "lora_forward": "lora_forward", "lora_merge": "merge",
             "response_logprob": "response_logprob", "dpo_loss": "dpo_loss"}

# A reader's answers, written apart from the book's: the cells they type.
READER = {
    "sft_targets": '''
def sft_targets(prompt, response, end):
    sequence = prompt + response + [end]
    inputs, targets = sequence[:-1], sequence[1:]
    for i in range(len(prompt) - 1):
        targets[i] = -100
    return inputs, targets


mastery.check_sft_targets(sft_targets)
''',
    "lora_forward": '''
def lora_forward(x, W, b, A, B, alpha, r):
    low_rank = (x @ A.T) @ B.T
    return x @ W.T + b + low_rank * alpha / r


mastery.check_lora_forward(lora_forward)
''',
    "lora_merge": '''
def merge(W, A, B, alpha, r):
    return W + alpha / r * (B @ A)


mastery.check_lora_merge(merge)
''',
    "response_logprob": '''
def response_logprob(logits, targets):
    keep = targets != -100
    log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    chosen = torch.gather(log_p, 2, torch.where(keep, targets, 0)[..., None])[..., 0]
    return torch.where(keep, chosen, 0.0).sum(dim=1)


mastery.check_response_logprob(response_logprob)
''',
    "dpo_loss": '''
def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    chosen = policy_chosen - ref_chosen
    rejected = policy_rejected - ref_rejected
    return torch.nn.functional.softplus(-beta * (chosen - rejected)).mean()


mastery.check_dpo_loss(dpo_loss)
''',
    "energy_rank": '''
values = torch.linalg.svdvals(delta) ** 2
rank = int(torch.searchsorted(values.cumsum(0) / values.sum(), 0.9)) + 1

mastery.check_energy_rank(rank, delta.numpy(), share=0.9)
''',
}


def _run(sources: list[str]) -> dict:
    return run_cells(sources, torch=torch)


def test_each_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet():
    assert_skeletons_are_not_written_yet(NOTEBOOK, CALLS, FUNCTIONS, _run)


def test_a_readers_own_answers_pass_are_recorded_and_the_books_are_not():
    assert_readers_answers_pass_and_only_they_are_recorded(FUNCTIONS, solutions, READER, _run)


SFT_SLIPS = [("for i in range(len(prompt) - 1):", "for i in range(len(prompt)):", "the last prompt position predicts"),
             ("        targets[i] = -100\n", "        pass\n", "ignore the prompt's own next tokens"),
             ("inputs, targets = sequence[:-1], sequence[1:]", "inputs, targets = sequence[:-1], sequence[:-1]",
              "shifted by one"),
             ("inputs, targets = sequence[:-1], sequence[1:]", "inputs, targets = sequence, sequence[1:] + [-100]",
              "the end token: it is only ever a target")]
LOGPROB_SLIPS = [("log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)", "log_p = logits",
                  "log-softmax of the logits"),
                 ("return torch.where(keep, chosen, 0.0).sum(dim=1)", "return chosen.sum(dim=1)",
                  "leave out the ignored positions"),
                 ("return torch.where(keep, chosen, 0.0).sum(dim=1)",
                  "return torch.where(keep, chosen, 0.0).sum(dim=1) / keep.sum(dim=1)", "the sum"),
                 ("return torch.where(keep, chosen, 0.0).sum(dim=1)", "return torch.where(keep, chosen, 0.0).sum()",
                  "expected shape (2,), got ()")]


@pytest.mark.parametrize(("gate", "old", "new", "named"), [("sft_targets", *s) for s in SFT_SLIPS] +
                         [("response_logprob", *s) for s in LOGPROB_SLIPS])
def test_each_slip_is_named(gate, old, new, named):
    assert old in READER[gate]
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[FUNCTIONS[gate]])
    assert not result and named in repr(result), repr(result)


@pytest.mark.parametrize(("gate", "old", "new"), [
    ("sft_targets", "sequence = prompt + response + [end]", "sequence = prompt + response + [end, end]"),
    ("response_logprob", "return torch.where(keep, chosen, 0.0).sum(dim=1)",
     "return torch.where(keep, chosen, 0.0).sum(dim=1) * 0.9"),
])
def test_a_wrong_answer_the_gate_has_no_name_for_still_fails(gate, old, new):
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[FUNCTIONS[gate]])
    assert not result and not result.first and " -- " not in repr(result), repr(result)


def test_the_packages_pieces_are_what_sft_and_dpo_train_with():
    ids = sft.render_ids([1, 2, 3], [4, 5], 0)
    assert ids == ([1, 2, 3, 4, 5], [-100, -100, 4, 5, 0])
    logits, targets = torch.randn(2, 5, 7, dtype=torch.float64), torch.tensor([[-100, 1, 2, 3, 4], [-100] * 4 + [6]])
    manual = torch.log_softmax(logits, -1)
    assert torch.allclose(preference.response_logprob(logits, targets),
                          torch.stack([manual[0, torch.arange(1, 5), targets[0, 1:]].sum(), manual[1, 4, 6]]))
    loss, margin = preference.dpo_loss(*(torch.tensor([-1.0, -2.0]),) * 4, beta=0.5)
    assert torch.allclose(loss, torch.log(torch.tensor(2.0))) and torch.equal(margin, torch.zeros(2))


@pytest.mark.slow
@pytest.mark.serial
def test_the_notebook_goes_on_with_the_readers_code_once_it_passes():
    everything = run_with_answers(NOTEBOOK, READER, CALLS)
    for name in ("sft_targets", "lora_forward", "response_logprob", "dpo_loss", "merge"):
        assert f"Your {name} passed its gate: the cells below run yours." in everything
    assert "the book's run took the same 10 steps: True" in everything
    assert "Module 9: 6 of 6 gates passed" in everything
