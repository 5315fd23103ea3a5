import math

import numpy as np
import pytest
import torch

from posttrainllm import evals, logit_lens, sae, speculative
from posttrainllm.model import GPT, GPTConfig, KVCache
from posttrainllm.sampling import chi_square_test

TINY = GPTConfig(vocab_size=24, block_size=32, n_layer=2, n_head=2, n_embd=16)


def _model(seed=0, **changes):
    import dataclasses

    return GPT(dataclasses.replace(TINY, seed=seed, **changes)).eval()


@pytest.mark.parametrize(
    ("completion", "answer", "correct", "formatted"),
    [("a map", "a map", 1, 1), (" a map ", "a map", 1, 1), ("a lantern", "a map", 0, 1), ("", "a map", 0, 0),
     ("a map and then a very long ramble about the day", "a map", 0, 0), ("a ma", "a map", 0, 1),
     ("12x", "12", 0, 1), ("a map<|user|>", "a map", 0, 0), (None, "a map", 0, 0)],
)
def test_rewards_score_malformed_completions_zero_and_never_raise(completion, answer, correct, formatted):
    assert evals.correctness(completion, answer) == correct
    assert evals.format_reward(completion) == formatted
    assert evals.composite_reward(completion, answer) == pytest.approx(correct + 0.2 * formatted)


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # all logits 0: every token equally likely
    ids = np.random.default_rng(0).integers(0, 24, 500)
    assert evals.perplexity(model, ids) == pytest.approx(24, rel=1e-5)


def test_greedy_continuation_with_a_cache_matches_recomputing_every_step():
    model = _model()
    context = list(np.random.default_rng(1).integers(0, 24, 10))
    ids = list(context)
    for _ in range(6):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert evals.greedy_continuation(model, context, 6) == ids[10:]


def test_memorisation_flags_text_the_model_was_trained_to_repeat_and_not_fresh_text():
    torch.manual_seed(0)
    model = _model()
    rng = np.random.default_rng(2)
    canary = list(rng.integers(0, 24, 24))
    fresh = [list(rng.integers(0, 24, 24)) for _ in range(5)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.tensor([canary[:-1]]), torch.tensor([canary[1:]])
    for _ in range(150):  # the canary, repeated many times in "training"
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert evals.memorisation(model, [canary], prefix=12, suffix=8).rate == 1.0
    assert evals.memorisation(model, fresh, prefix=12, suffix=8).rate == 0.0
    others = [list(rng.integers(0, 24, 8)) for _ in range(63)]
    assert evals.exposure(model, canary[:12], canary[12:20], others) == pytest.approx(6.0)  # ranked first of 64
    assert evals.exposure(_model(seed=5), canary[:12], canary[12:20], others) < 4
    with pytest.raises(ValueError, match="shorter than prefix"):
        evals.memorisation(model, [canary[:5]])


def test_logit_lens_at_the_last_layer_is_the_models_own_output():
    model = _model()
    idx = torch.randint(0, 24, (2, 12), generator=torch.Generator().manual_seed(3))
    lens = logit_lens.logit_lens(model, idx)
    assert lens.shape == (TINY.n_layer + 1, 2, 12, 24)
    with torch.no_grad():
        torch.testing.assert_close(lens[-1], model(idx))
    ranks = logit_lens.answer_ranks(lens, lens[-1].argmax(-1))
    assert torch.all(ranks[-1] == 0) and ranks.max() < 24


def test_sae_reconstruction_is_the_decoder_applied_to_the_encoder_and_its_report_is_sane():
    model = _model()
    idx = torch.randint(0, 24, (8, 32), generator=torch.Generator().manual_seed(4))
    acts = logit_lens.residual_streams(model, idx)[1].reshape(-1, 16)
    auto = sae.SparseAutoencoder(16, 64)
    x_hat, f = auto(acts)
    torch.testing.assert_close(x_hat, auto.decode(auto.encode(acts)))
    torch.testing.assert_close(x_hat, f @ auto.W_dec.T + auto.b_dec)
    losses = sae.train_sae(auto, acts.detach(), steps=300, l1=1e-3, batch_size=128, lr=3e-3)
    assert losses[-1] < losses[0] / 2
    report = sae.evaluate_sae(auto, model, 1, idx, idx)
    assert 0 < report.l0 < 64 and 0 <= report.dead_fraction < 1 and report.fvu < 0.5
    assert report.loss_sae < report.loss_ablated and report.loss_recovered > 0.5


def test_crop_forgets_positions_so_decoding_can_resume_from_there():
    model = _model()
    idx = torch.randint(0, 24, (1, 12), generator=torch.Generator().manual_seed(5))
    cache = KVCache(TINY.n_layer)
    with torch.no_grad():
        full = model(idx)
        model(idx[:, :10], cache=cache)
        cache.crop(7)
        rest = model(idx[:, 7:], cache=cache)
    torch.testing.assert_close(rest, full[:, 7:], atol=1e-5, rtol=1e-4)


def test_greedy_speculative_decoding_reproduces_greedy_target_decoding():
    target, draft = _model(seed=1), _model(seed=2, n_layer=1, n_embd=8, n_head=1)
    prompt = list(np.random.default_rng(6).integers(0, 24, 5))
    want = evals.greedy_continuation(target, prompt, 20)
    for k in (1, 3, 5):
        stats = speculative.speculative_generate(target, draft, prompt, 20, k=k)
        assert stats.tokens == want, k
        assert stats.target_forwards < 20 or stats.acceptance == 0
    same = speculative.speculative_generate(target, target, prompt, 20, k=4)  # a perfect draft
    assert same.tokens == want and same.acceptance == 1.0 and same.tokens_per_target_forward == 5


@pytest.mark.slow
def test_speculative_sampling_is_lossless_for_the_first_token():
    target, draft = _model(seed=1), _model(seed=2, n_layer=1, n_embd=8, n_head=1)
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        p = torch.softmax(target(torch.tensor([prompt]))[0, -1].double(), -1).numpy()
    rng = np.random.default_rng(7)
    firsts = [speculative.speculative_generate(target, draft, prompt, 2, k=2, temperature=1.0, rng=rng).tokens[0]
              for _ in range(3000)]
    _, _, p_value = chi_square_test(np.array(firsts), p)
    assert p_value > 0.001


def test_the_expected_tokens_formula_and_bad_arguments():
    assert speculative.expected_tokens_per_forward(0.0, 4) == 1.0
    assert speculative.expected_tokens_per_forward(1.0, 4) == 5.0
    assert speculative.expected_tokens_per_forward(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative.speculative_generate(_model(), _model(vocab_size=30), [1], 3)
    with pytest.raises(ValueError, match="rng"):
        speculative.speculative_generate(_model(), _model(), [1], 3, temperature=1.0)
    assert math.isclose(speculative.SpecStats().acceptance, 0.0)
