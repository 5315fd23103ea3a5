"""A reader's install, ``pip install 'posttrainllm[torch]'``, runs the notebooks.

The tests run offline, so nothing can be installed afresh. Instead the kernel is limited to what
that install would bring: the distributions ``posttrainllm[torch]`` requires, followed through
their own requirements (from the installed metadata, so from the ranges, not the pins), plus
the kernel a reader's Jupyter brings (``ipykernel``). Importing anything else from the kernel
fails as it would on the reader's machine: this is how module 6 was found to need tiktoken,
which the test extra had and the reader's did not.
"""

import json
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT, fresh_venv

READER = ["posttrainllm[torch]", "ipykernel"]


def closure(roots: list[str]) -> set[str]:
    """The distributions that installing ``roots`` brings, extras and markers honoured."""
    seen: set[tuple[str, frozenset]] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for spec in metadata.distribution(req.name).requires or []:
            dep = Requirement(spec)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in req.extras | {""}):
                todo.append(dep)
    return {name for name, _ in seen}


def reader_site(dists: set[str], site: Path) -> None:
    """``site``: links to every file and folder those distributions installed, and nothing else."""
    site.mkdir()
    for dist in metadata.distributions():
        if (name := canonicalize_name(dist.metadata["Name"])) not in dists or name == "posttrainllm":
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)


def test_the_reader_extra_brings_what_the_notebooks_import():
    dists = closure(READER)
    assert {"torch", "tiktoken", "numpy", "matplotlib", "ipywidgets"} <= dists
    assert not dists & {"pytest", "nbval", "wgpu", "jupyter-book", "playwright"}  # a reader needs none of these


@pytest.mark.parametrize("notebook", ["05-language-models.ipynb", "06-tokenization.ipynb"])
@pytest.mark.slow
@pytest.mark.serial
def test_a_notebook_runs_with_only_the_reader_install(tmp_path, monkeypatch, notebook):
    """The kernel runs in a new venv that sees only the reader's distributions (and this checkout's
    package), so an import of anything else fails there as on the reader's machine."""
    reader_site(closure(READER), tmp_path / "site")
    python = fresh_venv(tmp_path / "venv", borrow=[tmp_path / "site", ROOT])
    spec = tmp_path / "jupyter" / "kernels" / "reader"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "a reader's install", "language": "python"}), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    path = ROOT / "notebooks" / notebook
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="reader", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
