import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import char_mlp, ngram, scaling
from posttrainllm import sampling as smp
from posttrainllm.chars import CharVocab
from posttrainllm.tools import mastery

logit_lists = st.lists(st.floats(-8, 8, allow_nan=False), min_size=2, max_size=12).map(np.array)


@settings(max_examples=200, deadline=None)
@given(logits=logit_lists, temperature=st.floats(0.05, 4), k=st.integers(1, 12), p=st.floats(0.01, 1.0))
def test_distribution_is_normalised_and_respects_k_and_p(logits, temperature, k, p):
    k = min(k, logits.size)
    probs = smp.next_token_distribution(logits, temperature, top_k=k, top_p=p)
    assert probs.sum() == pytest.approx(1.0) and (probs >= 0).all()
    assert (probs > 0).sum() <= k
    kept = probs > 0
    base = smp.next_token_distribution(logits, temperature, top_k=k)
    # the kept set reaches p of the top-k mass, and dropping its least likely member would not
    assert base[kept].sum() >= p - 1e-9
    if kept.sum() > 1:
        assert base[kept].sum() - base[kept].min() < p + 1e-9


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(temperature=0.5), dict(temperature=2.0, top_k=5), dict(top_p=0.7), dict(top_k=3, top_p=0.9)]
)
def test_sampled_frequencies_match_the_renormalised_distribution(kwargs):
    logits = np.log(np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02]))
    rng = np.random.default_rng(123)
    draws = [smp.sample(logits, rng=rng, **kwargs) for _ in range(20_000)]
    _, _, p_value = smp.chi_square_test(draws, smp.next_token_distribution(logits, **kwargs))
    assert p_value > 1e-3


def test_the_chi_square_test_rejects_the_wrong_distribution_and_forbidden_tokens():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    rng = np.random.default_rng(0)
    draws = [smp.sample(logits, temperature=0.5, rng=rng) for _ in range(5000)]
    assert smp.chi_square_test(draws, smp.next_token_distribution(logits))[2] < 1e-6
    assert smp.chi_square_test([0, 1, 2], [0.5, 0.5, 0.0])[2] == 0.0


def test_chi_square_p_values_match_known_quantiles():
    # chi2 survival function at the 5% critical values for 1, 5 and 10 degrees of freedom
    for stat, dof in [(3.841459, 1), (11.070498, 5), (18.307038, 10)]:
        assert smp._upper_regularized_gamma(dof / 2, stat / 2) == pytest.approx(0.05, rel=1e-4)


def test_greedy_takes_the_argmax_and_ties_go_to_the_lowest_id():
    assert smp.greedy(np.array([0.1, 2.0, 2.0, -1.0])) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(logits=np.array([])), "non-empty"),
        (dict(logits=np.array([0.0, np.nan])), "NaN"),
        (dict(logits=np.zeros(3), temperature=-1), "temperature"),
        (dict(logits=np.zeros(3), top_k=4), "top_k"),
        (dict(logits=np.zeros(3), top_p=0.0), "top_p"),
    ],
)
def test_bad_sampler_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        smp.next_token_distribution(**kwargs)


def test_bigram_counts_probabilities_and_perplexity():
    ids = np.array([0, 1, 0, 1, 0, 2])
    lm = ngram.BigramLM(3, alpha=0.0).fit(ids)
    assert lm.counts[0].tolist() == [0, 2, 1] and lm.probs[0].tolist() == pytest.approx([0, 2 / 3, 1 / 3])
    assert lm.probs[2].tolist() == pytest.approx([1 / 3] * 3)  # an unseen row is uniform, not 0/0
    assert ngram.perplexity(np.log(7.0)) == pytest.approx(7.0)
    smoothed = ngram.BigramLM(3, alpha=1.0).fit(ids)
    assert np.isfinite(smoothed.nll(np.array([2, 2, 2])))


def test_char_vocab_round_trip_and_unknown_characters():
    vocab = CharVocab("hello world")
    assert vocab.decode(vocab.encode("low")) == "low"
    with pytest.raises(ValueError, match="'z' is not in this vocabulary"):
        vocab.encode("z")


def test_char_mlp_training_is_reproducible_and_learns():
    ids = np.array(CharVocab("abcab" * 40).encode("abcab" * 40))
    x, y = char_mlp.windows(ids, 3)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = char_mlp.CharMLP(3, context=3, embed=4, hidden=8)
        runs.append(char_mlp.train(model, x, y, steps=150, batch_size=16, lr=1e-2, seed=0))
    assert runs[0] == runs[1]
    assert char_mlp.evaluate(model, x, y) < 0.2 < np.log(3)


def test_power_law_fit_recovers_known_parameters():
    n = np.geomspace(1e3, 1e6, 8)
    law = scaling.fit_power_law(n, 50.0 * n**-0.3 + 1.5, floors=2000)
    assert law.alpha == pytest.approx(0.3, rel=0.05) and law.c == pytest.approx(1.5, abs=0.05)


def test_compute_frontier_keeps_only_improving_runs():
    assert scaling.compute_frontier([1, 2, 3, 4], [5.0, 6.0, 4.0, 4.5]).tolist() == [0, 2]
    assert scaling.training_flops(10, 100) == 6000


def test_top_p_gate_passes_the_reference_and_explains_missing_renormalisation():
    assert mastery.check_top_p(lambda probs, p: smp.next_token_distribution(np.log(probs), top_p=p))

    def unnormalised(probs, p):
        order = np.argsort(-probs, kind="stable")
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[(np.cumsum(probs[order]) - probs[order]) < p - 1e-12]] = True
        return np.where(keep, probs, 0.0)

    failures = mastery.check_top_p(unnormalised).failures
    assert failures and any("renormalise" in f for f in failures)
