"""Where this checkout's book and notebooks live.

The package is installed editable from the checkout (``pip install -e .``), so the files
the book is made of sit next to it. ``POSTTRAINLLM_ROOT`` points elsewhere when needed.
"""

from __future__ import annotations

import os
from pathlib import Path

_MARKER = Path("book") / "study-queue.md"


def repo_root() -> Path:
    """The checkout's top folder: the one holding ``book/study-queue.md``."""
    env = os.environ.get("POSTTRAINLLM_ROOT")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2])  # posttrainllm/tools/checkout.py -> the clone
    candidates.extend([Path.cwd(), *Path.cwd().parents])
    for root in candidates:
        if (root / _MARKER).is_file():
            return root
    raise FileNotFoundError(
        "cannot find the posttrainllm checkout (a folder with book/study-queue.md). "
        "Install the package editable from a clone (`make lab` or `pip install -e .`), "
        "run from inside the clone, or set POSTTRAINLLM_ROOT."
    )
