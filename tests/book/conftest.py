"""Fixtures for the whole-book tests: the time-budget report, the strict build, a served site.

The fixtures chain (report -> build -> site) so the book is built after the notebooks were
timed, whatever order pytest runs the test files in.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from posttrainllm.tools.serve import make_server
from tests.conftest import ROOT

BUILD = ROOT / "_build"
REPORT = BUILD / "reports" / "notebook-times.json"
FAIL_FACTOR = 3.0  # a notebook fails only past 3x its budget: noise never fails CI, a runaway does
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _execute_and_time(path):
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


@pytest.fixture(scope="session")
def budget_report(nbval_times):
    """Each notebook's run time: nbval's, when this session ran it; otherwise executed here."""
    times, failed = nbval_times
    notebooks = {}
    for path in NOTEBOOKS:
        rel = path.relative_to(ROOT).as_posix()
        measured_by = "nbval" if rel in times and rel not in failed else "nbclient"
        seconds = times[rel] if measured_by == "nbval" else _execute_and_time(path)
        budget = nbformat.read(path, as_version=4).metadata["posttrainllm"]["budget_s"]
        notebooks[path.name] = {"seconds": round(seconds, 2), "budget_s": budget, "measured_by": measured_by}
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "fail_factor": FAIL_FACTOR,
        "notebooks": notebooks,
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


@pytest.fixture(scope="session")
def built_book(budget_report):
    """The strict build (`-W -n --keep-going`): any warning fails it. Returns (returncode, log)."""
    if not (BUILD / "vendor" / ".installed").is_file():
        pytest.fail("the book's vendored JavaScript is missing: run `make vendor` (make test does)")
    shutil.rmtree(BUILD / "html", ignore_errors=True)  # no stale page from an earlier build survives
    jupyter_book = Path(sys.executable).with_name("jupyter-book")  # the CLI of this environment
    cmd = [str(jupyter_book), "build", "--all", "-W", "-n", "--keep-going", str(ROOT)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (BUILD / "reports").mkdir(parents=True, exist_ok=True)
    (BUILD / "reports" / "book-build.log").write_text(log, encoding="utf-8")
    return proc.returncode, log


@pytest.fixture(scope="session")
def site(built_book):
    """The built book served on 127.0.0.1 by the same server `make book` uses; yields its base URL."""
    returncode, log = built_book
    if returncode != 0:
        pytest.fail("the book did not build; see _build/reports/book-build.log")
    server = make_server(BUILD / "html", port=0, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def playwright():
    """One Playwright driver for the session: its sync API allows only one at a time."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def wasm_oracle():
    """The PyTorch oracle's first 10 losses, computed here (not read from the page) from the
    trainer's initialisation on the batches the cell draws: from the first 65,536 training ids."""
    from posttrainllm import wasm
    from posttrainllm.model import oracle_setup

    config, _, ids, _ = oracle_setup()
    return wasm.oracle_losses(wasm.oracle_at_init(config), ids[: 1 << 16], 10, wasm.BATCH)
