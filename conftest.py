"""Session-wide pytest glue: time every notebook while nbval executes it.

nbval runs each notebook's cells as test items (``notebooks/NN-name.ipynb::Cell K``); the kernel
start-up falls in the first cell's setup. Summing every phase gives the notebook's run time,
which ``tests/book/test_budgets.py`` checks and reports.
"""

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

NOTEBOOK_TIMES: dict[str, float] = defaultdict(float)
NOTEBOOK_FAILED: set[str] = set()


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        NOTEBOOK_TIMES[path] += report.duration
        if report.failed:
            NOTEBOOK_FAILED.add(path)


def pytest_configure(config):
    """No test, notebook kernel or book build of this run reads or writes the reader's own study
    answers or record of passed gates: they all get files of the run's own, empty at the start."""
    folder = Path(tempfile.mkdtemp(prefix="study-answers-"))
    os.environ["POSTTRAINLLM_STUDY_ANSWERS"] = str(folder / "answers.json")
    os.environ["POSTTRAINLLM_PROGRESS"] = str(folder / "progress.json")


def pytest_sessionfinish(session):
    """With ``POSTTRAINLLM_NBVAL_TIMES`` set, keep this session's notebook times in that file for a
    later session (``make test`` builds the book in one of its own)."""
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller saw every notebook's reports and writes the file
    path = os.environ.get("POSTTRAINLLM_NBVAL_TIMES")
    if path and NOTEBOOK_TIMES:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"seconds": NOTEBOOK_TIMES, "failed": sorted(NOTEBOOK_FAILED)}),
                              encoding="utf-8")


@pytest.fixture(scope="session")
def nbval_times():
    """Seconds each notebook took under nbval, and which ones failed: in this session, or in the
    earlier one that wrote ``POSTTRAINLLM_NBVAL_TIMES``."""
    path = os.environ.get("POSTTRAINLLM_NBVAL_TIMES")
    if not NOTEBOOK_TIMES and path and Path(path).is_file():
        kept = json.loads(Path(path).read_text(encoding="utf-8"))
        return kept["seconds"], set(kept["failed"])
    return NOTEBOOK_TIMES, NOTEBOOK_FAILED
