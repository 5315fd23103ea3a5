"""Module 8's exercises as a reader meets them: the skeletons in the notebook are told they are
not written yet, a reader's own answers pass, the new gates name their slips and fail a wrong
answer they have no name for, and the notebook (an AdamW race, the rescued hot learning rate)
goes on with the reader's code once it passes."""

import numpy as np
import pytest
import torch

from posttrainllm import optim
from posttrainllm import train as training
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.solutions import mechanics as solutions
from posttrainllm.tools import mastery, record
from tests.conftest import ROOT
from tests.exercises import (
    assert_readers_answers_pass_and_only_they_are_recorded,
    assert_skeletons_are_not_written_yet,
    run_cells,
    run_with_answers,
)

NOTEBOOK = ROOT / "notebooks" / "08-training-mechanics.ipynb"
CALLS = {"adamw_update": "check_adamw_update(adamw_update)", "warmup_cosine": "check_warmup_cosine(warmup_cosine)",
         "accumulated_step": "check_accumulated_step(accumulated_step)",
         "loss_scaling": "check_loss_scaling(scaler_step)", "max_loss_scale": "check_max_loss_scale(scale"}
FUNCTIONS = {"adamw_update": "adamw_update", "warmup_cosine": "warmup_cosine",
             "accumulated_step": "accumulated_step", "loss_scaling": "scaler_step"}

# A reader's answers, written apart from the book's: the cells they type.
READER = {
    "adamw_update": '''
def adamw_update(w, g, m, v, t, lr, betas, eps, weight_decay):
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g**2
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    w = w - lr * weight_decay * w
    return w - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


mastery.check_adamw_update(adamw_update)
''',
    "warmup_cosine": '''
import math


def warmup_cosine(step, max_lr, warmup, total, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    done = (step - warmup) / (total - warmup)
    return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * done)) / 2


mastery.check_warmup_cosine(warmup_cosine)
''',
    "accumulated_step": '''
def accumulated_step(model, micro_batches, optimizer, max_norm):
    k = len(micro_batches)
    for p in model.parameters():
        p.grad = None
    losses = []
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / k).backward()
        losses.append(loss.item())
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    optimizer.step()
    return sum(losses) / k, norm


mastery.check_accumulated_step(accumulated_step)
''',
    "loss_scaling": '''
def scaler_step(grads, scale, good_steps, growth_interval):
    unscaled = [g / scale for g in grads]
    if any(not np.all(np.isfinite(g)) for g in unscaled):
        return None, scale / 2, 0
    if good_steps + 1 >= growth_interval:
        return unscaled, scale * 2, 0
    return unscaled, scale, good_steps + 1


mastery.check_loss_scaling(scaler_step)
''',
    "max_loss_scale": '''
scale = 2.0 ** np.floor(np.log2(65504 / np.abs(grads).max()))

mastery.check_max_loss_scale(scale, grads)
''',
}


def _run(sources: list[str]) -> dict:
    return run_cells(sources, torch=torch, np=np)


def test_each_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet():
    assert_skeletons_are_not_written_yet(NOTEBOOK, CALLS, FUNCTIONS, _run)


def test_a_readers_own_answers_pass_are_recorded_and_the_books_are_not():
    assert_readers_answers_pass_and_only_they_are_recorded(FUNCTIONS, solutions, READER, _run)


SCHEDULE_SLIPS = [("return max_lr * (step + 1) / warmup", "return max_lr * step / warmup", "step 0 is max_lr / warmup"),
                  ("math.cos(math.pi * done)", "math.cos(2 * math.pi * done)", "half a cosine period"),
                  ("return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * done)) / 2",
                   "return max_lr * (1 + math.cos(math.pi * done)) / 2", "falls to min_lr, not to 0")]
STEP_SLIPS = [("(loss / k).backward()", "loss.backward()", "divide each micro-batch's loss by their number"),
              ("        p.grad = None\n", "        pass\n", "zero the gradients at the start of each step"),
              ("    for x, y in micro_batches:\n", "    for x, y in micro_batches:\n        optimizer.zero_grad()\n",
               "zero the gradients once per step"),
              ("norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()",
               "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float('inf')).item()",
               "clip after the last backward"),
              ("norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()",
               "norm = sum(torch.nn.utils.clip_grad_norm_([p], max_norm).item() ** 2\n"
               "               for p in model.parameters()) ** 0.5",
               "clip by the global norm of all the gradients together"),
              ("norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()",
               "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
               "    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float('inf')).item()",
               "return the norm measured before clipping")]


@pytest.mark.parametrize(("gate", "old", "new", "named"), [("warmup_cosine", *s) for s in SCHEDULE_SLIPS] +
                         [("accumulated_step", *s) for s in STEP_SLIPS])
def test_each_slip_is_named(gate, old, new, named):
    assert old in READER[gate]
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[FUNCTIONS[gate]])
    assert not result and named in repr(result), repr(result)


@pytest.mark.parametrize(("gate", "old", "new"), [
    ("warmup_cosine", "return min_lr\n", "return min_lr * 0.9\n"),
    ("accumulated_step", "optimizer.step()", "optimizer.step()\n    optimizer.step()"),
    ("accumulated_step", "return sum(losses) / k, norm", "return losses[-1], norm"),
])
def test_a_wrong_answer_the_gate_has_no_name_for_still_fails(gate, old, new):
    assert old in READER[gate]
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[FUNCTIONS[gate]])
    assert not result and not result.first and " -- " not in repr(result), repr(result)


def test_the_accumulated_step_is_the_full_batch_step_and_what_train_takes():
    torch.set_default_dtype(torch.float64)
    try:
        config = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
        x, y = torch.randint(0, 13, (2, 6, 8), generator=torch.Generator().manual_seed(0))
        whole, halves = GPT(config), GPT(config)
        loss, _ = training.accumulated_step(whole, [(x, y)], optim.SGD(whole.parameters(), lr=0.5))
        parts = [(x[:3], y[:3]), (x[3:], y[3:])]
        mean, norm = training.accumulated_step(halves, parts, optim.SGD(halves.parameters(), lr=0.5), max_norm=1e9)
        assert abs(mean - loss) < 1e-12 and norm > 0
        assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(whole.parameters(), halves.parameters(),
                                                                                  strict=True))
        # train() takes its steps with it: the same weights as one step by hand
        ids = torch.randint(0, 13, (500,), generator=torch.Generator().manual_seed(1))
        by_train, by_hand = GPT(config), GPT(config)
        training.train(by_train, ids, steps=1, batch_size=4, optimizer=optim.SGD(by_train.parameters(), lr=0.1))
        hand_x, hand_y = training.get_batch(ids, 4, config.block_size, generator=torch.Generator().manual_seed(0))
        _, hand_loss = by_hand(hand_x, hand_y)
        hand_loss.backward()
        optim.SGD(by_hand.parameters(), lr=0.1).step()
        assert all(torch.equal(a, b) for a, b in zip(by_train.parameters(), by_hand.parameters(), strict=True))
    finally:
        torch.set_default_dtype(torch.float32)


def test_numpy_adamw_trains_as_the_torch_adamw_does():
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
    ids = torch.randint(0, 13, (500,), generator=torch.Generator().manual_seed(2))
    torch.set_default_dtype(torch.float64)
    try:
        models = [GPT(config), GPT(config)]
        runs = [training.train(models[0], ids, 20, optimizer=optim.AdamW(models[0].parameters(), 3e-3,
                                                                          weight_decay=0.1)),
                training.train(models[1], ids, 20, optimizer=optim.NumpyAdamW(models[1].parameters(), lr=3e-3,
                                                                               weight_decay=0.1))]
    finally:
        torch.set_default_dtype(torch.float32)
    assert np.allclose(runs[0]["train"], runs[1]["train"], rtol=0, atol=1e-12)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(*(m.parameters() for m in models),
                                                                          strict=True))


@pytest.mark.slow
@pytest.mark.serial
def test_the_notebook_goes_on_with_the_readers_code_once_it_passes():
    # up to the last cell that runs the reader's code; the learning-rate range test and the three
    # constant rates (a minute, none of it the reader's) stand in as the figures the notebook stored
    given = {"sweep = lambda step:": "pass",
             "curves = {}": "hot, good = [(300, 2.6)], [(300, 0.59)]  # 3e-2 stalls above 2.0; 3e-3 ends at 0.59"}
    everything = run_with_answers(NOTEBOOK, READER, CALLS, until="## Gradient checkpointing", given=given)
    trained_with = ("adamw_update", "warmup_cosine", "accumulated_step")
    for name in trained_with:
        assert f"Your {name} passed its gate: the cells below run yours." in everything
    assert "AdamW (your update), lr 3e-3 held-out loss after 150 steps: 0.8" in everything
    assert "held-out loss after 300 steps: with the schedule 0.55" in everything
    assert record.load() == set(trained_with)
