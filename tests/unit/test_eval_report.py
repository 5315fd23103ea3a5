"""The error taxonomy, the eval matrix's statistics and the generated model card."""

import numpy as np
import pytest

from posttrainllm import eval_report, failures, sft
from posttrainllm.pretrained import Recipe, base_model

WHERE = "One day fog lay on the water, and Ivy forgot a warm scarf at the forest. Where was it?"


@pytest.mark.parametrize("answer, category", [
    ("the forest", None),
    (None, "no answer"),
    ("  ", "no answer"),
    ("the forest, I think", "right answer, extra words"),
    ("the forst", "misspelt"),
    ("a warm scarf", "wrong kind of answer"),
    ("Ivy", "wrong kind of answer"),
    ("the hill", "wrong detail of the right kind"),
    ("pays.", "not an answer"),
])
def test_every_wrong_answer_gets_the_first_category_that_fits(answer, category):
    assert failures.categorise(WHERE, answer, "the forest") == category


def test_taxonomy_counts_only_wrong_answers_and_question_kind_is_checked():
    counts = failures.taxonomy([WHERE] * 3, ["the forest", "the hill", None], ["the forest"] * 3)
    assert counts == {"wrong detail of the right kind": 1, "no answer": 1}
    with pytest.raises(ValueError, match="not one of the task's questions"):
        failures.question_kind("Tell me a story.")


def test_holm_adjustment_steps_down_and_stays_monotone():
    adjusted = eval_report.holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})


def test_bootstrap_intervals_cover_the_difference_and_stratifying_removes_a_confound():
    right = np.array([1] * 40 + [0] * 10 + [0] * 40 + [1] * 10, dtype=bool)
    group = np.array([True] * 50 + [False] * 50)
    low, high = eval_report.bootstrap_difference(right[group].astype(float), right[~group].astype(float))
    assert low < 0.6 < high
    # an easy stratum mostly in the group: pooled, the group looks better; within strata it is not
    strata = np.array(["easy"] * 45 + ["hard"] * 5 + ["easy"] * 5 + ["hard"] * 45)
    right = np.array([1] * 45 + [0] * 5 + [1] * 5 + [0] * 45, dtype=bool)
    estimate, low, high = eval_report.stratified_difference(right, group, strata)
    assert right[group].mean() - right[~group].mean() == pytest.approx(0.8) and estimate == 0.0 and low == high == 0.0


def test_matrix_entry_and_model_card_of_a_tiny_model(tmp_path):
    recipe = Recipe(corpus_chars=20_000, vocab_size=300, n_layer=1, n_embd=16, n_head=2, steps=5, block_size=160)
    model, tok = base_model(recipe, cache_dir=tmp_path)
    questions = sft.examples("questions", 4, split="test")
    e = eval_report.evaluate("tiny", model, tok, questions, perplexity=9.5)
    assert len(e.answers) == 4 and e.right.shape == e.choice_right.shape == (4,)
    assert eval_report.choice(model, tok, questions[0].prompt, ["the hill"]) == "the hill"
    card = eval_report.model_card(e, "a test model", questions, np.array([True, False, True, False]))
    assert card.startswith("### tiny") and "a test model" in card and "9.500" in card
    assert f"{e.right.mean():.1%}" in card and "2 of the 4 questions share a 13-gram" in card
