"""The notebooks in the reader's browser: JupyterLite's Pyodide kernel, with no install.

Pyodide is CPython compiled to WebAssembly. Pure Python runs in it as it is, numpy and
matplotlib come as Pyodide builds, and PyTorch, tiktoken and wgpu-py do not exist there. So
the book publishes a *browser edition* of each module that has something to run without them
(:data:`IN_BROWSER`): the same notebook with the cells that need PyTorch replaced by a note.

Two cell tags in the notebooks say what a cell needs, and the tests hold them to it
(tests/book/test_lite.py runs every browser edition with those libraries blocked):

- ``not-in-pyodide``: needs PyTorch, tiktoken or wgpu-py, or reads a file of the repository
  outside the package (a committed benchmark table); left out of the browser edition.
- ``pure-python``: needs nothing but the standard library and posttrainllm, so it runs even
  offline, with no download at all (module 4's micrograd, module 6's BPE, and the cells of
  modules 3 and 7 that read the WGSL kernels and the WASM trainer's sources).

The site serves Pyodide and the pure-Python wheels itself (book/_ext/lite_site.py); numpy and
matplotlib are fetched from the Pyodide CDN the first time, by :func:`load`.
"""

from __future__ import annotations

import copy
import importlib.util
import sys

from posttrainllm.tools import colab

# The modules with a browser edition, by notebook name (the others need PyTorch throughout).
IN_BROWSER = (
    "01-from-a-line",
    "02-gradient-descent",
    "03-tensors",
    "04-backprop",
    "05-language-models",
    "06-tokenization",
    "07-attention",
)
SKIP_TAG = "not-in-pyodide"
PURE_TAG = "pure-python"
# Libraries Pyodide does not have: a browser edition must run with these blocked.
ABSENT = ("torch", "tiktoken", "tokenizers", "wgpu", "wasmtime")
# Pyodide builds that the page downloads once; their wheels are not on PyPI.
CDN_PACKAGES = ("numpy", "matplotlib")
CDN = "https://cdn.jsdelivr.net/pyodide/v{version}/full/"
KERNELSPEC = {"name": "python", "display_name": "Python (Pyodide)", "language": "python"}

HEADER = """\
**You are running this notebook in your browser** (JupyterLite, on Pyodide: Python compiled to
WebAssembly). The cells that need PyTorch, tiktoken, wgpu-py or a file of the book's repository
are left out, each replaced by a note; the first code cell downloads numpy and matplotlib from
the Pyodide CDN, once. What you change is kept in this browser's storage only. The book shows
every output of the full notebook."""

SKIPPED = """\
*Left out in the browser: this cell needs PyTorch, tiktoken or wgpu-py, which Pyodide does not
have, or a file of the book's repository, which the browser has no copy of. Run the notebook
locally (`make lab`) or on Colab to see it run.*

```python
{source}
```"""

SETUP = """\
# numpy and matplotlib are Pyodide builds, downloaded once from the Pyodide CDN
from posttrainllm.tools import lite

await lite.load(*lite.CDN_PACKAGES)"""


def in_browser() -> bool:
    """True under Pyodide (the browser), False under CPython."""
    return sys.platform == "emscripten"


def _missing(packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if importlib.util.find_spec(p) is None]


async def load(*packages: str) -> None:
    """Make ``packages`` importable. Under Pyodide they are downloaded from the CDN; a failed
    download (offline, a blocked host) raises a ``RuntimeError`` that says what to do. Under
    CPython this only checks that they are installed."""
    errors: list[str] = []
    if in_browser():
        import pyodide_js  # the Pyodide JavaScript API, present only in the browser

        try:
            await pyodide_js.loadPackage(list(packages), messageCallback=lambda _msg: None, errorCallback=errors.append)
        except Exception as err:  # a JavaScript error: the network, a bad lock file
            errors.append(str(err))
        where = f"from the Pyodide CDN ({CDN.format(version=pyodide_js.version)})"
    else:
        where = "with pip (they are in this package's dependencies)"
    missing = _missing(packages)
    if missing:
        cause = f" The browser said: {' '.join(errors)[:400]}" if errors else ""
        raise RuntimeError(
            f"could not load {', '.join(missing)} {where}. This notebook needs the network once to "
            "download them; offline, only the pure-Python parts of the book run here (module 4's "
            "micrograd, module 6's BPE, the kernel sources of modules 3 and 7). To run everything, "
            "run the notebook locally: make lab." + cause
        )


def edition(nb: dict) -> dict:
    """The browser edition of a notebook (nbformat 4 as a dict): outputs cleared, a header and
    the :func:`load` cell first, each ``not-in-pyodide`` cell replaced by a note showing its code,
    and the install cell (:mod:`posttrainllm.tools.colab`) left out."""
    cells = []
    for cell in nb["cells"]:
        cell = copy.deepcopy(cell)
        tags = cell.get("metadata", {}).get("tags", [])
        if colab.TAG in tags:  # the browser has the package already
            continue
        if cell["cell_type"] == "code":
            if SKIP_TAG in tags:
                cell = _markdown(SKIPPED.format(source="".join(cell["source"]).rstrip()), cell.get("id"))
            else:
                cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    title = 1 if cells and cells[0]["cell_type"] == "markdown" else 0
    cells[title:title] = [_markdown(HEADER, "browser-edition"), _code(SETUP, "browser-edition-setup")]
    out = copy.deepcopy({k: v for k, v in nb.items() if k != "cells"})
    out["metadata"].pop("widgets", None)  # widget state belongs to the stored outputs
    out["metadata"]["kernelspec"] = dict(KERNELSPEC)
    out["cells"] = cells
    return out


def pure_cells(nb: dict) -> list[dict]:
    """The notebook's ``pure-python`` code cells, in order, with their stored outputs."""
    return [c for c in nb["cells"] if c["cell_type"] == "code" and PURE_TAG in c.get("metadata", {}).get("tags", [])]


def _markdown(text: str, cell_id: str | None) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": text}


def _code(text: str, cell_id: str) -> dict:
    return {"cell_type": "code", "id": cell_id, "metadata": {}, "source": text, "outputs": [], "execution_count": None}
