"""The package as an installed distribution sees it: one version, a clear error without torch."""

import json
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import posttrainllm

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert metadata.version("posttrainllm") == posttrainllm.__version__


def test_license_file_matches_the_declared_license():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_missing_torch_names_the_command_that_installs_it():
    hide_torch = textwrap.dedent("""
        import importlib.machinery
        real = importlib.machinery.PathFinder.find_spec
        def find_spec(name, path=None, target=None):  # as if torch were not installed
            return None if name.split(".")[0] == "torch" else real(name, path, target)
        importlib.machinery.PathFinder.find_spec = find_spec
        import posttrainllm.model
    """)
    result = subprocess.run([sys.executable, "-c", hide_torch], capture_output=True, text=True)
    assert result.returncode == 1
    assert "ModuleNotFoundError" in result.stderr and "pip install 'posttrainllm[torch]'" in result.stderr


def test_torch_imports_normally_when_installed():
    import torch

    assert torch.tensor([1.0]).sum().item() == 1.0


def test_binder_environment_resolves_against_the_project():
    # offline, so against the installed environment: the extras exist and nothing conflicts
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                             "--quiet", "-r", "binder/requirements.txt"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"


def test_repository_address_is_written_once():
    from posttrainllm.tools import colab

    owner = colab.repository_url(ROOT).split("/")[3]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    mentions = [f for f in tracked if f != "_config.yml" and (ROOT / f).is_file()
                and f"github.com/{owner}/" in _without_install_cells(ROOT / f)]
    assert mentions == []


def _without_install_cells(path: Path) -> str:
    """A file's text; for a notebook, without its install cell (generated from _config.yml and
    checked by tests/unit/test_colab.py)."""
    text = path.read_text(errors="ignore")
    if path.suffix != ".ipynb":
        return text
    from posttrainllm.tools import colab

    cells = json.loads(text)["cells"]
    return json.dumps([c for c in cells if colab.TAG not in c["metadata"].get("tags", [])])


def test_the_module_map_names_every_module_once():
    import re

    from posttrainllm.tools import coverage

    doc = posttrainllm.__doc__.split("Imports here stay light")[0]
    named = re.findall(r"``(\w+)``", doc.replace("``Value``", ""))
    teaching = {m for m in coverage.package_modules() if not m.startswith("tools.") and m != "__main__"}
    assert sorted(named) == sorted(set(named)), "a module is named twice"
    assert set(named) == teaching | {"tools"}
