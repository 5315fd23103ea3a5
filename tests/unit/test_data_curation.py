"""Deduplication, quality rules, n-gram contamination and the planted curation pipeline."""

import collections
import re

import numpy as np
import pytest

from posttrainllm import contamination, curation, dedup, quality


def test_exact_duplicates_ignore_case_spacing_and_punctuation():
    texts = ["The fox ran.", "the  FOX ran", "The fox sat.", "The fox ran!"]
    assert dedup.exact_duplicates(texts) == [1, 3]


# the same sentence in three scripts, and a second Russian one: before, all four normalised to ""
RUSSIAN = "Лиса бежала через тёмный лес к старой мельнице у реки"
OTHERS = ["Η αλεπού έτρεξε μέσα από το σκοτεινό δάσος στον παλιό μύλο", "狐狸 跑过 黑暗的 森林 来到 河边的 老磨坊",
          "Мельник смотрел на воду и думал о зиме и о хлебе"]


def test_text_in_any_script_keeps_its_words():
    assert dedup.normalise("Straße, STRASSE!  Ёлка") == "strasse strasse ёлка"
    assert dedup.exact_duplicates([RUSSIAN, *OTHERS, RUSSIAN.upper()]) == [4]
    assert dedup.near_duplicates([RUSSIAN, *OTHERS]) == []
    assert contamination.dirty([RUSSIAN, OTHERS[0]], [f"вчера. {RUSSIAN}. конец"], n=5) == [True, False]


def test_minhash_agreement_estimates_jaccard():
    a = {f"w{i}" for i in range(100)}
    b = {f"w{i}" for i in range(30, 130)}  # Jaccard 70 / 130
    hasher = dedup.MinHasher(num_perm=2000, seed=0)
    agreement = (hasher.signature(a) == hasher.signature(b)).mean()
    assert agreement == pytest.approx(dedup.jaccard(a, b), abs=0.04)
    assert (hasher.signature(a) == hasher.signature(set(a))).all()


def test_lsh_finds_near_copies_and_only_reports_verified_pairs():
    base = " ".join(f"word{i}" for i in range(60))
    near = base.replace("word10", "other").replace("word40", "thing")
    unrelated = " ".join(f"token{i}" for i in range(60))
    pairs = dedup.near_duplicates([base, unrelated, near], threshold=0.7)
    assert [(i, j) for i, j, _ in pairs] == [(0, 2)] and pairs[0][2] == pytest.approx(
        dedup.jaccard(dedup.shingles(base), dedup.shingles(near)))
    assert dedup.keep_first(3, pairs) == [0, 1]
    with pytest.raises(ValueError, match="do not split into 7 bands"):
        dedup.candidate_pairs(np.zeros((2, 128), dtype=np.uint64), bands=7)


def test_candidate_probability_is_the_banding_s_curve():
    assert dedup.candidate_probability(1.0, 32, 4) == 1.0 and dedup.candidate_probability(0.0, 32, 4) == 0.0
    assert dedup.candidate_probability(0.5, 1, 1) == 0.5


def test_quality_rules_name_what_is_wrong():
    assert quality.passes("the mill by the river") and quality.passes("Mira")
    assert quality.problems("") == ["empty"]
    assert quality.problems("the the the") == ["repetition"]
    assert set(quality.problems("#@%&")) == {"symbols", "non-alphabetic words"}
    assert quality.problems("12 34") == ["non-alphabetic words"]
    assert "word length" in quality.problems("supercalifragilisticexpialidocious")


def test_contamination_flags_shared_ngrams_only():
    corpus = ["one two three four five six"]
    assert contamination.dirty(["zero one two three four", "one two four"], corpus, n=4) == [True, False]
    assert contamination.dirty(["anything at all"], [], n=2) == [False]
    assert contamination.ngrams("a b", 3) == set()


def test_planted_set_and_stages_remove_each_fault():
    rows, kinds = curation.planted()
    assert collections.Counter(kinds) == {"clean": 2000, "junk": 400, "duplicate": 600,
                                          "leaked": curation.LEAKED * curation.COPIES}
    kept = curation.stages()
    assert list(kept) == list(curation.STAGES)
    for earlier, later in zip(curation.STAGES, curation.STAGES[1:], strict=False):
        assert set(kept[later]) <= set(kept[earlier])
    final = collections.Counter(kinds[i] for i in kept["decontaminated"])
    assert final["junk"] == final["leaked"] == 0
    with pytest.raises(ValueError, match="unknown stage 'tidy'"):
        curation.stage_model("tidy")


@pytest.mark.parametrize("call, error, message", [
    (lambda: dedup.near_duplicates([], bands=0), ValueError, "bands must be a whole number of at least 1, got 0"),
    (lambda: dedup.near_duplicates(["a b c"], num_perm=0), ValueError, "num_perm must be a whole number"),
    (lambda: dedup.near_duplicates(["a b c"], n=True), ValueError, "n must be a whole number"),
    (lambda: dedup.near_duplicates(["a b c"], bands=5), ValueError, "num_perm=128 hash values do not split into "
                                                                    "bands=5"),
    (lambda: dedup.near_duplicates(["a b c"], threshold=1.5), ValueError, "from 0 to 1; got 1.5"),
    (lambda: dedup.near_duplicates(["a b c", None]), TypeError, "a document is text (str), not NoneType"),
    (lambda: dedup.exact_duplicates([b"bytes"]), TypeError, "a document is text (str), not bytes"),
    (lambda: quality.problems(None), TypeError, "a document is text (str), not NoneType"),
    (lambda: contamination.dirty([7], ["a b c"], n=1), TypeError, "not int"),
])
def test_curation_names_bad_input(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_fewer_than_two_texts_have_no_near_duplicates():
    assert dedup.near_duplicates([]) == [] and dedup.near_duplicates(["only one text here"]) == []
