"""The package as an installed distribution sees it: one version, a clear error without torch."""

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import posttrainllm
from tests.conftest import WITHOUT_TORCH

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert metadata.version("posttrainllm") == posttrainllm.__version__


def test_license_file_matches_the_declared_license():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_missing_torch_names_the_command_that_installs_it():
    result = subprocess.run([sys.executable, "-c", WITHOUT_TORCH + "import posttrainllm.model\n"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "ModuleNotFoundError" in result.stderr and "pip install 'posttrainllm[torch]'" in result.stderr


def test_without_torch_other_code_can_still_ask_whether_torch_is_there():
    probe = WITHOUT_TORCH + textwrap.dedent("""
        import importlib.util
        import posttrainllm
        assert importlib.util.find_spec("torch") is None
        try:
            import torch
        except ModuleNotFoundError as err:
            assert "pip install" not in str(err), err  # another library's own import: the usual error
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


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
    teaching = {m for m in coverage.package_modules() if not m.startswith(("tools.", "solutions.")) and m != "__main__"}
    assert sorted(named) == sorted(set(named)), "a module is named twice"
    assert set(named) == teaching | {"tools"}


def _pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    assert all(len(pair) == 2 for pair in pairs), "constraints.txt holds name==version lines only"
    return {canonicalize_name(name): version for name, version in pairs}


def _declared():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    # an extra that names other extras of this package ("posttrainllm[torch,webgpu]") pins nothing itself
    return [r for r in map(Requirement, project["dependencies"] + extras) if r.name != project["name"]]


def test_pyproject_declares_ranges_and_constraints_pin_each_inside_it():
    from packaging.utils import canonicalize_name

    pins = _pins()
    exact = [str(r) for r in _declared() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert exact == [], "exact pins belong in constraints.txt"
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not pinned in constraints.txt (make constraints)"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}"


def test_ci_tests_the_pinned_versions():
    if os.environ.get("CI", "").lower() != "true":
        pytest.skip("a laptop may install from the ranges (make CONSTRAINTS=); CI installs the pins")
    from packaging.utils import canonicalize_name

    # what pip installed into this environment: not the copies a package vendors, such as the ones
    # setuptools puts on sys.path once imported (torch.compile's CPU backend imports it)
    site = sorted({sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")})
    installed = {canonicalize_name(d.metadata["Name"]): d.version.split("+")[0]
                 for d in metadata.distributions(path=site)}
    differ = {n: (v, installed.get(n)) for n, v in _pins().items() if installed.get(n) != v}
    assert differ == {}, f"pinned vs installed: {differ}"


def test_no_module_imports_one_that_imports_it_back():
    """Imports inside functions included: a loop is a loop, however late it closes."""
    from posttrainllm.tools.affected import _sources, _uses

    sources = _sources(ROOT)
    graph = {name: _uses(code, set(sources)) - {name} for name, code in sources.items()}

    def loop_from(start: str) -> list[str] | None:
        paths = [[start]]
        seen = set()
        while paths:
            path = paths.pop()
            for used in sorted(graph[path[-1]]):
                if used == start:
                    return [*path, start]
                if used not in seen:
                    seen.add(used)
                    paths.append([*path, used])
        return None

    loops = {" -> ".join(loop) for name in graph if (loop := loop_from(name))}
    assert not loops, f"import loops: {sorted(loops)}"
