"""Notebook run times against their budgets (the report is shown on the book's timing page)."""

import pytest

from tests.book.conftest import FAIL_FACTOR, NOTEBOOKS


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_notebook_runs_within_three_times_its_budget(budget_report, name):
    entry = budget_report["notebooks"][name]
    assert entry["seconds"] <= FAIL_FACTOR * entry["budget_s"], (
        f"{name} took {entry['seconds']:.0f} s, over {FAIL_FACTOR:g}x its {entry['budget_s']} s budget"
    )
