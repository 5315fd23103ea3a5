import math

import numpy as np
import pytest

from posttrainllm import comparison, contamination
from posttrainllm.comparison import Scoreboard, improved, mcnemar_p, wilson_interval


def test_wilson_interval_matches_the_textbook_value_and_stays_inside_0_1():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)  # the classic 0-of-10 upper bound
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(1 - 0.2775, abs=1e-4)
    for k in range(0, 91, 7):  # mirror symmetry: k right is n - k wrong
        a, b = wilson_interval(k, 90), wilson_interval(90 - k, 90)
        assert a[0] == pytest.approx(1 - b[1]) and a[1] == pytest.approx(1 - b[0])


def test_wilson_interval_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    draws = rng.binomial(90, 0.4, size=4000)
    covered = np.mean([lo <= 0.4 <= hi for lo, hi in (wilson_interval(int(k), 90) for k in draws)])
    assert 0.93 < covered < 0.97


def test_wilson_interval_refuses_impossible_counts():
    for successes, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError, match="successes"):
            wilson_interval(successes, n)


def test_mcnemar_counts_only_the_questions_the_models_disagree_on():
    agree = np.array([1, 0] * 50, dtype=bool)
    assert mcnemar_p(agree, agree) == 1.0
    new, old = agree.copy(), agree.copy()
    new[1:13:2] = True  # six questions only `new` gets right: 2 / 2**6
    assert mcnemar_p(new, old) == pytest.approx(2 / 64)
    new[1] = False  # five: 2 / 2**5, not significant at 5%
    assert mcnemar_p(new, old) == pytest.approx(2 / 32)
    assert mcnemar_p(old, new) == mcnemar_p(new, old)


def test_improved_needs_both_the_direction_and_the_test():
    old = np.zeros(100, dtype=bool)
    new = old.copy()
    new[:10] = True
    assert improved(new, old) and not improved(old, new)
    new[:10] = False
    new[:3] = True  # 3 of 100 more right: p = 0.25, not an improvement
    assert new.sum() > old.sum() and not improved(new, old)


def test_paired_scores_must_be_right_or_wrong_on_the_same_questions():
    with pytest.raises(ValueError, match="same questions"):
        mcnemar_p(np.ones(5), np.ones(6))
    with pytest.raises(ValueError, match="right"):
        mcnemar_p(np.array([0.5, 1.0]), np.array([1.0, 1.0]))


def test_scoreboard_shows_intervals_and_ranks_only_by_the_paired_test():
    board = Scoreboard("exact match")
    board.add("old <b>", np.r_[np.ones(40), np.zeros(60)], loss="1.000")
    board.add("new", np.r_[np.ones(55), np.zeros(45)], loss="0.900")
    text = repr(board)
    assert "40% [31%, 50%]" in text and "55% [45%, 64%]" in text and "0.900" in text
    assert "&lt;b&gt;" in board._repr_html_() and "<b>" not in board._repr_html_()
    assert board.improved("new", "old <b>") and not board.improved("old <b>", "new")
    with pytest.raises(KeyError, match="no model named 'newer'"):
        board.improved("newer", "old <b>")
    with pytest.raises(ValueError, match="same questions"):
        board.add("short", np.ones(90))


@pytest.mark.parametrize("discordant, fewer", [(1, 0), (37, 11), (1500, 700), (3001, 1480)])
def test_mcnemar_matches_the_exact_binomial_tail(discordant, fewer):
    from fractions import Fraction

    a = np.r_[np.ones(fewer), np.zeros(discordant - fewer)].astype(bool)
    exact = Fraction(2 * sum(math.comb(discordant, i) for i in range(fewer + 1)), 2**discordant)
    assert comparison.mcnemar_p(a, ~a) == pytest.approx(min(1.0, float(exact)), rel=1e-10)


@pytest.mark.parametrize("call", [
    lambda: comparison.wilson_interval(3, 10, z=float("nan")),
    lambda: comparison.wilson_interval(3, 10, z=-1.96),
    lambda: comparison.wilson_interval(3, 10, z=float("inf")),
    lambda: comparison.improved([1, 1], [0, 0], alpha=2),
    lambda: comparison.improved([1, 1], [0, 0], alpha=0),
    lambda: contamination.dirty(["a b"], ["a b"], n=0),
    lambda: contamination.dirty(["a b"], ["a b"], n=True),
])
def test_settings_outside_their_range_are_refused(call):
    with pytest.raises(ValueError):
        call()


def test_a_scoreboard_refuses_a_model_scored_on_no_questions():
    board = Scoreboard()
    with pytest.raises(ValueError, match="'empty' was scored on no questions"):
        board.add("empty", [])
    assert board.right == {}  # nothing half-added
