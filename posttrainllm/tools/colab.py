"""The install cell every notebook opens with, for Colab and any machine without the book.

A notebook opened on Colab arrives alone: no package, and none of the files beside it that the
notebooks read (the study queue, the models' recipes). Its first code cell fetches the book and
installs the package from it. Where ``posttrainllm`` is importable already (a clone after
``make lab``, Binder, the tests) the cell does nothing and prints nothing, so its stored output
is empty on every machine. The book's pages leave it out (``remove-cell``), and so do the
browser editions, which have the package already.

The cell is generated from the repository address in ``_config.yml``, the one place it is
written: after changing the address, ``python -m posttrainllm.tools.colab`` rewrites the cells,
and ``tests/unit/test_colab.py`` checks that every notebook carries the current one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TAG = "install-if-missing"
TAGS = [TAG, "remove-cell"]

_CELL = """\
# On Colab, or any machine without the book: fetch it and install its package with what the
# notebooks need (Colab has PyTorch already). Where posttrainllm is installed, this does nothing.
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("posttrainllm") is None:
    repository, book = "REPOSITORY", os.path.expanduser("~/posttrainllm")
    if not os.path.isdir(book):
        subprocess.run(["git", "clone", "--quiet", "--depth=1", repository, book], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", book + "[torch]"], check=True)
    sys.path.insert(0, book)
    os.chdir(os.path.join(book, "notebooks"))  # where the notebooks' relative paths start"""


def repository_url(root: Path) -> str:
    """The book's repository address: ``repository: url:`` in ``root/_config.yml``."""
    text = (Path(root) / "_config.yml").read_text(encoding="utf-8")
    match = re.search(r"^repository:[ \t]*\n(?:[ \t]+.*\n)*?[ \t]+url:[ \t]*(\S+)", text, re.M)
    if match is None:
        raise ValueError(f"{root}/_config.yml has no `repository: url:` to install the book from")
    return match.group(1)


def install_cell(url: str) -> str:
    """The cell's source for the repository at ``url``."""
    return _CELL.replace("REPOSITORY", url)


def write(root: Path) -> list[Path]:
    """Make each notebook's first code cell the current install cell (inserted after the title
    when missing); returns the notebooks that changed. Re-execute those before committing."""
    source = install_cell(repository_url(root)).splitlines(keepends=True)
    changed = []
    for path in sorted((Path(root) / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        if code and TAG in code[0]["metadata"].get("tags", []):
            if code[0]["source"] == source:
                continue
            code[0]["source"] = source
        else:
            at = 1 if nb["cells"] and nb["cells"][0]["cell_type"] == "markdown" else 0
            nb["cells"].insert(at, {"cell_type": "code", "execution_count": None, "id": "install-if-missing",
                                    "metadata": {"tags": list(TAGS)}, "outputs": [], "source": source})
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        changed.append(path)
    return changed


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for path in write(root):
        print(f"rewrote the install cell of {path}")
