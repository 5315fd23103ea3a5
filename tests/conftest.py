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
    """A private copy of the real study queue with every answer reset to TBD.

    Tests never write to the checkout's file, and pass whatever the learner has filled in.
    """
    from posttrainllm.tools import study

    dest = tmp_path / "book" / "study-queue.md"
    dest.parent.mkdir()
    shutil.copyfile(ROOT / "book" / "study-queue.md", dest)
    for topic in study.load(dest):
        if topic.filled:
            study.fill(topic.name, "TBD", force=True, path=dest)
    return dest
