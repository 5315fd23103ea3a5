"""The reader's record of the gates they have passed, kept in their own folder.

A mastery gate that passes on the reader's answer adds its name here (never on the book's own
solution); ``posttrainllm progress`` and the last cell of each notebook read it back. The file is
``progress.json`` in :func:`posttrainllm.tools.home.folder`, or the one ``POSTTRAINLLM_PROGRESS``
names: JSON, ``{"version": 1, "passed": [gate, ...]}``, rewritten atomically under a lock, so two
notebooks that pass gates at the same moment keep both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from posttrainllm import atomic
from posttrainllm.tools import home

VERSION = 1


class RecordError(ValueError):
    """The record cannot be read or written; the message names the file and says what to do."""


def path() -> Path:
    """Where this reader's record is kept."""
    named = os.environ.get("POSTTRAINLLM_PROGRESS")
    return Path(named) if named else home.folder() / "progress.json"


def load(file: Path | None = None) -> set[str]:
    """The names of the gates passed so far; empty when nothing was recorded yet."""
    file = Path(file or path())
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"cannot read your record of passed gates in {file}: {err}. Nothing was changed; "
                          "move the file aside to start a new record, or set POSTTRAINLLM_PROGRESS.") from None
    data = data if isinstance(data, dict) else {}  # a JSON list or number is not a record either
    passed = data.get("passed")
    if data.get("version") != VERSION or not isinstance(passed, list) or not all(isinstance(g, str) for g in passed):
        raise RecordError(f'{file} is not a record of passed gates ({{"version": {VERSION}, "passed": [...]}}); '
                          "nothing was changed.")
    return set(passed)


def mark(gate: str, file: Path | None = None) -> None:
    """Add ``gate`` to the record (kept once, however often it passes)."""
    file = Path(file or path())
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with atomic.locked(file):
            passed = load(file)
            if gate not in passed:
                text = json.dumps({"version": VERSION, "passed": sorted(passed | {gate})}, indent=1) + "\n"
                atomic.write_text(file, text)
    except OSError as err:
        raise RecordError(f"cannot write your record of passed gates in {file}: {err.strerror or err}") from None
