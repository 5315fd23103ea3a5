"""Run a notebook's browser edition under CPython with what Pyodide lacks blocked, and compare
each cell's text output with the one stored in the full notebook (nbval's sanitising rules).

`python -m tests.book.lite_check notebooks/04-backprop.ipynb` prints the cells that differ,
which is how a maintainer finds the cells to tag ``not-in-pyodide``.
"""

from __future__ import annotations

import configparser
import functools
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from posttrainllm.tools import lite

ROOT = Path(__file__).resolve().parents[2]
# Pyodide has no such module: a finder that refuses the names, which also leaves them out of
# sys.modules (IPython imports numpy for its printers whenever "numpy" is in sys.modules).
# regex is a Pyodide build, not loaded unless a cell imports it: the tokenizer uses re there.
BLOCK = """\
import sys

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in Pyodide)", name=name)

sys.meta_path.insert(0, _Absent())
assert not [m for m in sys.modules if m.split(".")[0] in {names!r}], "imported before the block"
"""


@functools.cache
def _sanitizers() -> list[tuple[re.Pattern, str]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "notebooks" / "sanitize.cfg")
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


def text_of(outputs: list) -> str:
    """A cell's outputs as nbval compares them: streams, errors and text/plain, sanitised."""
    parts = []
    for out in outputs:
        data = out.get("data", {})
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
        elif "text/plain" in data and "application/vnd.jupyter.widget-view+json" not in data:
            parts.append(data["text/plain"])
    # stored JSON may hold a text as a list of lines
    text = "".join("".join(p) if isinstance(p, list) else p for p in parts)
    for pattern, replace in _sanitizers():
        text = pattern.sub(replace, text)
    return text


def html_of(outputs: list) -> list[str]:
    """A cell's HTML outputs that carry a script: the browser cells, which inline the package's
    kernels and runtimes. (Highlighted source is left out: its escaping varies with Pygments.)"""
    html = ["".join(out["data"]["text/html"]) for out in outputs if "text/html" in out.get("data", {})]
    return [h for h in html if "<script" in h]


def _run_blocked(nb: nbformat.NotebookNode, stored: dict[str, str], blocked: tuple[str, ...],
                 stored_html: dict[str, list[str]] | None = None) -> list[str]:
    """Execute ``nb`` in an empty folder with ``blocked`` refused; the cells whose text (and, where
    ``stored_html`` has them, HTML) differs from the stored one (by cell id), or the first cell
    that failed. (The browser has no copy of the repository: a kept cell that reads one of its
    files, as ``../benchmarks/results/...``, fails here as it would there.)"""
    nb.cells.insert(0, nbformat.v4.new_code_cell(BLOCK.format(names=blocked)))
    with tempfile.TemporaryDirectory() as empty:
        try:
            NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": empty}}).execute()
        except CellExecutionError as err:
            return [f"a cell failed: {str(err).strip().splitlines()[-1]}"]
    ran = [cell for cell in nb.cells[1:] if cell.cell_type == "code" and cell.id in stored]
    return [
        f"cell {cell.id}: got {text_of(cell.outputs)[:300]!r}, stored {stored[cell.id][:300]!r}"
        for cell in ran if text_of(cell.outputs) != stored[cell.id]
    ] + [
        f"cell {cell.id}: its HTML differs from the stored one"
        for cell in ran if stored_html and stored_html.get(cell.id) and html_of(cell.outputs) != stored_html[cell.id]
    ]


def run_edition(path: Path) -> list[str]:
    """Differences between the browser edition's outputs under CPython and the stored ones."""
    nb = nbformat.read(path, as_version=4)
    stored = {c.id: text_of(c.outputs) for c in nb.cells if c.cell_type == "code"}
    return _run_blocked(nbformat.from_dict(lite.edition(nb)), stored, (*lite.ABSENT, "regex"))


# micrograd and the BPE, and the cells of modules 3 and 7 that read the WGSL kernels and the WASM
# trainer's sources from the installed package
PURE_SOURCES = ("03-tensors", "04-backprop", "06-tokenization", "07-attention")


def pure_notebook() -> tuple[nbformat.NotebookNode, list[str], list[list[str]]]:
    """One notebook of the ``pure-python`` cells of :data:`PURE_SOURCES` (outputs cleared), and
    the text and the HTML each cell stored in its own notebook."""
    cells, expected, html = [], [], []
    for stem in PURE_SOURCES:
        for cell in lite.pure_cells(nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)):
            cells.append(nbformat.v4.new_code_cell(cell.source, id=cell.id))
            expected.append(text_of(cell.outputs))
            html.append(html_of(cell.outputs))
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": lite.KERNELSPEC}), expected, html


def run_pure() -> list[str]:
    """Differences from the stored outputs when the pure notebook runs with numpy, matplotlib
    and every library outside the standard library and posttrainllm blocked."""
    nb, expected, html = pure_notebook()
    stored = {cell.id: want for cell, want in zip(nb.cells, expected, strict=True)}
    stored_html = {cell.id: want for cell, want in zip(nb.cells, html, strict=True)}
    return _run_blocked(nb, stored, (*lite.ABSENT, "regex", *lite.CDN_PACKAGES), stored_html)


if __name__ == "__main__":
    if sys.argv[1:] == ["pure"]:
        print(*run_pure() or ["the pure-python cells run as stored"], sep="\n  ")
    else:
        for arg in sys.argv[1:]:
            print(arg, *run_edition(Path(arg)) or ["as stored"], sep="\n  ")
