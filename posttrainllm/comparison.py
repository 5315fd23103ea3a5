"""Module 10: comparing models on the same questions — intervals, a paired test, and a scoreboard
that ranks only what the test supports.

Ninety questions is a small sample: a model that answers 40% of them right has a 95% interval of
roughly 30% to 50%, so two models a few points apart may be equally good. Every accuracy gets a
**Wilson score interval** (Wilson, 1927), which, unlike ``p ± 1.96·se``, stays inside [0, 1]
and does not collapse to a point at 0 or n right. Two models scored on the *same* questions are
compared with the **exact McNemar test** (McNemar, 1947): only the questions exactly one of them
gets right say anything about which is better, and if both were equally good each such question
would be a fair coin. A paired test sees far smaller differences than two overlapping intervals.
"""

from __future__ import annotations

import html
import math

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval for a proportion of ``successes`` in ``n`` trials (95% at the
    default ``z``)."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got successes={successes}, n={n}")
    if not (isinstance(z, int | float) and 0 < z < math.inf):
        raise ValueError(f"z is a positive, finite number of standard deviations (1.96 for 95%), got {z!r}")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _scores(right) -> np.ndarray:
    right = np.asarray(right)
    if right.ndim != 1 or not np.isin(right, (0, 1)).all():
        raise ValueError("scores are one right (1/True) or wrong (0/False) per question, in a 1-D array")
    return right.astype(bool)


def _paired(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = _scores(a), _scores(b)
    if a.shape != b.shape:
        raise ValueError(f"paired scores are over the same questions, got {a.size} and {b.size} of them")
    return a, b


def mcnemar_p(a, b) -> float:
    """Two-sided exact McNemar p-value for per-question right/wrong arrays ``a`` and ``b`` of two
    models on the same questions: the binomial probability, at one half, of a split of the
    discordant questions at least as uneven as the one observed."""
    a, b = _paired(a, b)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    n, k = only_a + only_b, min(only_a, only_b)
    return min(1.0, 2 * _binomial_tail(n, k)) if n else 1.0


def _binomial_tail(n: int, k: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2) with k <= n/2, in O(k) float steps: the terms grow up to
    i = k, so sum them downwards relative to the largest, from its logarithm (2**-n underflows
    past n = 1074; exact integers made this quadratic)."""
    log_top = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2)
    total, term = 0.0, 1.0
    for i in range(k, -1, -1):
        total += term
        term *= i / (n - i + 1)  # C(n, i-1) / C(n, i)
        if term < 1e-17 * total:
            break
    return math.exp(log_top + math.log(total))


def improved(new, old, alpha: float = 0.05) -> bool:
    """Whether ``new`` answers more of the same questions right than ``old`` *and* the exact
    McNemar test rejects "equally good" at level ``alpha``."""
    if not (isinstance(alpha, int | float) and 0 < alpha < 1):
        raise ValueError(f"alpha is a significance level between 0 and 1 (0.05 is usual), got {alpha!r}")
    a, b = _paired(new, old)
    return bool(a.sum() > b.sum() and mcnemar_p(a, b) < alpha)


class Scoreboard:
    """Models scored on the same questions: per-question right/wrong for each, shown as accuracy
    with its Wilson interval next to any other columns. It renders as an HTML table in the book
    and as aligned text (what nbval compares) in a terminal. Orderings between models are asked
    of :meth:`improved`, which requires the paired test, never read off the accuracies alone."""

    def __init__(self, label: str = "exact match"):
        self.label = label
        self.right: dict[str, np.ndarray] = {}
        self.columns: dict[str, dict[str, str]] = {}

    def add(self, name: str, right, **columns: str) -> None:
        """Add a model's per-question right/wrong (the same questions, in the same order, for
        every model) and any extra columns, already formatted as text."""
        right = _scores(right)
        if right.size == 0:
            raise ValueError(f"{name!r} was scored on no questions: a scoreboard needs one at least for an accuracy")
        others = next(iter(self.right.values()), right)
        if right.shape != others.shape:
            raise ValueError(f"{name!r} was scored on {right.size} questions, the others on {others.size}: "
                             "a scoreboard compares the same questions")
        self.right[name] = right
        self.columns[name] = columns

    def accuracy(self, name: str) -> float:
        return float(self.right[self._known(name)].mean())

    def interval(self, name: str) -> tuple[float, float]:
        right = self.right[self._known(name)]
        return wilson_interval(int(right.sum()), right.size)

    def improved(self, new: str, old: str, alpha: float = 0.05) -> bool:
        """Whether model ``new`` beats ``old`` on these questions by the exact McNemar test."""
        return improved(self.right[self._known(new)], self.right[self._known(old)], alpha)

    def p_value(self, a: str, b: str) -> float:
        return mcnemar_p(self.right[self._known(a)], self.right[self._known(b)])

    def _known(self, name: str) -> str:
        if name not in self.right:
            raise KeyError(f"no model named {name!r} on this scoreboard; it has {sorted(self.right)}")
        return name

    def rows(self) -> list[list[str]]:
        """Header and rows as text: model, accuracy [95% interval], then the extra columns."""
        extra = list(dict.fromkeys(k for cols in self.columns.values() for k in cols))
        out = [["model", f"{self.label} [95% CI]", *[k.replace("_", " ") for k in extra]]]
        for name in self.right:
            lo, hi = self.interval(name)
            cell = f"{self.accuracy(name):.0%} [{lo:.0%}, {hi:.0%}]"
            out.append([name, cell, *[self.columns[name].get(k, "") for k in extra]])
        return out

    def __repr__(self) -> str:
        rows = self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 for r in rows]
        return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])

    def _repr_html_(self) -> str:
        head, *body = self.rows()
        th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"
