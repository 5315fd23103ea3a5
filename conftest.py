"""Session-wide pytest glue: time every notebook while nbval executes it.

nbval runs each notebook's cells as test items (``notebooks/NN-name.ipynb::Cell K``); the kernel
start-up falls in the first cell's setup. Summing every phase gives the notebook's run time,
which ``tests/book/test_budgets.py`` checks and reports.
"""

from collections import defaultdict

import pytest

NOTEBOOK_TIMES: dict[str, float] = defaultdict(float)
NOTEBOOK_FAILED: set[str] = set()


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        NOTEBOOK_TIMES[path] += report.duration
        if report.failed:
            NOTEBOOK_FAILED.add(path)


@pytest.fixture(scope="session")
def nbval_times():
    """Seconds each notebook took under nbval in this session, and which ones failed."""
    return NOTEBOOK_TIMES, NOTEBOOK_FAILED
