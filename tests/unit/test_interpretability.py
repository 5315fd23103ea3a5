"""The induction-head toolkit (posttrainllm.induction) and SAE steering (sae.steer)."""

import pytest
import torch

from posttrainllm import induction, sae
from posttrainllm.model import GPT, GPTConfig


def _model(seed=0):
    return induction.AttentionOnly(vocab_size=16, context=12, n_layer=2, n_head=2, d_model=8, seed=seed).double()


def _tokens(seed=0):
    return induction.repeated_tokens(3, 6, 16, torch.Generator().manual_seed(seed))


def test_repeated_tokens_repeat_their_first_half():
    idx = _tokens()
    assert idx.shape == (3, 12) and torch.equal(idx[:, :6], idx[:, 6:])


def test_head_outputs_are_the_residual_terms_and_ablating_all_leaves_the_direct_path():
    model, idx = _model(), _tokens()
    run = model(idx)
    direct = (model.embed[idx] + model.pos[:12]) @ model.unembed
    heads = sum(out.sum(1) for out in run.head_outputs) @ model.unembed
    torch.testing.assert_close(run.logits, direct + heads)
    every = frozenset((layer, head) for layer in range(2) for head in range(2))
    torch.testing.assert_close(model(idx, ablate=every).logits, direct)


def test_patching_a_head_with_its_own_output_changes_nothing_and_another_output_does():
    model, idx, other = _model(), _tokens(), _tokens(seed=1)
    run, run_other = model(idx), model(other)
    torch.testing.assert_close(model(idx, patch={(1, 0): run.head_outputs[1][:, 0]}).logits, run.logits)
    patched = model(idx, patch={(0, 1): run_other.head_outputs[0][:, 1]})
    assert not torch.allclose(patched.logits, run.logits)
    torch.testing.assert_close(patched.head_outputs[0][:, 1], run_other.head_outputs[0][:, 1])


def test_scores_read_the_previous_token_and_the_induction_target():
    T, half = 8, 4
    previous = torch.zeros(1, 1, T, T)
    previous[0, 0, 0, 0] = 1
    previous[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1
    target = torch.eye(T)[None, None].clone()
    target[0, 0, half:] = 0
    target[0, 0, torch.arange(half, T), torch.arange(1, half + 1)] = 1  # position t attends t - half + 1
    run = induction.Run(torch.zeros(1), [], [previous])
    assert induction.previous_token_scores(run).item() == 1.0
    run = induction.Run(torch.zeros(1), [], [target])
    assert induction.prefix_matching_scores(run).item() == 1.0
    assert induction.previous_token_scores(run).item() == 0.0  # it never looks one back


def test_training_records_both_halves_and_patching_gives_a_fraction_per_head():
    model = _model()
    history = induction.train(model, steps=5, halves=(3, 6), vocab_size=16, batch=4)
    assert len(history["first"]) == len(history["second"]) == 5
    clean, corrupted = _tokens(), torch.cat([_tokens(seed=2)[:, :6], _tokens()[:, 6:]], 1)
    recovery = induction.patching_recovery(model, clean, corrupted)
    damage = induction.ablation_damage(model, clean)
    assert recovery.shape == damage.shape == (2, 2) and torch.isfinite(recovery).all()


def test_model_rejects_a_width_heads_do_not_divide():
    with pytest.raises(ValueError, match="multiple of n_head"):
        induction.AttentionOnly(16, 12, n_head=3, d_model=8)


def test_steering_adds_the_direction_inside_the_block_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    idx = torch.randint(32, (2, 8))
    with torch.no_grad():
        plain = model(idx)
        with sae.steer(model, 1, torch.zeros(16), 5.0):
            torch.testing.assert_close(model(idx), plain)
        with sae.steer(model, 2, torch.ones(16), 3.0):
            steered = model(idx)
        torch.testing.assert_close(model(idx), plain)  # the hook is gone after the block
    assert not torch.allclose(steered, plain)
    with pytest.raises(ValueError, match="layer must be between 1 and 2"):
        with sae.steer(model, 0, torch.ones(16), 1.0):
            pass
