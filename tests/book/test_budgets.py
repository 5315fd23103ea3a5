"""Notebook run times against their budgets (the report is shown on the book's timing page), and the
build-time execution of the reference chapters that compute."""

import re

import pytest

from tests.book.conftest import FAIL_FACTOR, NOTEBOOKS
from tests.conftest import ROOT


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_notebook_runs_within_three_times_its_budget(budget_report, name):
    entry = budget_report["notebooks"][name]
    assert entry["seconds"] <= FAIL_FACTOR * entry["budget_s"], (
        f"{name} took {entry['seconds']:.0f} s, over {FAIL_FACTOR:g}x its {entry['budget_s']} s budget"
    )


CHAPTER_BUDGET_S = 60  # each reference chapter that computes at build time, on 2 cores
EXECUTED = re.compile(r"/book/([\w-]+)\.md: Executed notebook in ([\d.]+) seconds")


def test_every_computed_reference_chapter_runs_within_three_times_its_budget(built_book):
    _, log = built_book
    seconds = {name: float(s) for name, s in EXECUTED.findall(log)}
    pages = (ROOT / "book").glob("*.md")
    computed = {p.stem for p in pages if "execution_mode: force" in p.read_text(encoding="utf-8")}
    assert set(seconds) == computed, f"executed {sorted(seconds)}, expected {sorted(computed)}"
    slow = {name: s for name, s in seconds.items() if s > FAIL_FACTOR * CHAPTER_BUDGET_S}
    assert not slow, f"over {FAIL_FACTOR:g}x the {CHAPTER_BUDGET_S} s budget: {slow}"
