import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"


def require(available: bool, what: str) -> None:
    """Skip when a system component is missing on a laptop; fail in CI, where .ci/run installs it."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and CI=true: .ci/run should have installed it")
    pytest.skip(f"{what} is not installed (CI installs it; see .ci/run)")


def chromium_path() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def queue_copy(tmp_path):
    """A private copy of the real study queue, so tests never write to the checkout's file."""
    dest = tmp_path / "book" / "study-queue.md"
    dest.parent.mkdir()
    shutil.copyfile(ROOT / "book" / "study-queue.md", dest)
    return dest
