import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"


# Python source that makes the interpreter running it behave as if PyTorch were not installed
WITHOUT_TORCH = (
    "import importlib.machinery\n"
    "_find = importlib.machinery.PathFinder.find_spec\n"
    "importlib.machinery.PathFinder.find_spec = lambda name, path=None, target=None: (\n"
    "    None if name.split('.')[0] == 'torch' else _find(name, path, target))\n"
)


def require(available: bool, what: str) -> None:
    """Skip when a system component is missing on a laptop; fail in CI, where .ci/run installs it."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and CI=true: .ci/run should have installed it")
    pytest.skip(f"{what} is not installed (CI installs it; see .ci/run)")


def chromium_path() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(autouse=True)
def own_answers_file(tmp_path_factory, monkeypatch):
    """Each test starts with an empty study-answers file and an empty record of passed gates."""
    folder = tmp_path_factory.mktemp("answers")
    monkeypatch.setenv("POSTTRAINLLM_STUDY_ANSWERS", str(folder / "answers.json"))
    monkeypatch.setenv("POSTTRAINLLM_PROGRESS", str(folder / "progress.json"))


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


def fresh_venv(path: Path, borrow: list[Path] | None = None) -> Path:
    """A new virtual environment at ``path`` without posttrainllm, whose third-party packages
    (numpy, torch, pip, setuptools …) are borrowed from this one through a ``.pth`` line, because
    the tests run offline; ``borrow`` names the folders to borrow instead. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    folders = borrow if borrow is not None else [sysconfig.get_paths()["purelib"]]
    (Path(site) / "zz_borrowed_dependencies.pth").write_text("".join(f"{f}\n" for f in folders))
    return python


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points back at the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAINLLM_", "PYTHON"))}
    return env | extra
