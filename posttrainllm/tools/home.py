"""The reader's own folder: what they write while learning (study answers, passed gates) is kept
there, outside any clone of the book, so a ``git pull`` never meets it and a pip install reaches it.

``$XDG_DATA_HOME/posttrainllm`` on Linux (by default ``~/.local/share/posttrainllm``),
``~/Library/Application Support/posttrainllm`` on macOS, ``%APPDATA%\\posttrainllm`` on Windows.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def folder() -> Path:
    """Where this reader's files are kept (created by whoever first writes there)."""
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "posttrainllm"
