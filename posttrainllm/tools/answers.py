"""The reader's study answers, kept in a file of their own, outside any clone of the book.

The study queue's topics are the book's (``book/study-queue.md``, all "Why here: TBD"); what a
reader writes in a study card or with ``posttrainllm study fill`` is theirs, so it is kept in
their own folder (:func:`posttrainllm.tools.home.folder`) as ``study-answers.json``, or in the
file ``POSTTRAINLLM_STUDY_ANSWERS`` names (on Colab, a folder of your Drive).
A ``git pull`` of the book never meets it, a pip install reaches it, and it never ends up in a
contribution. It is JSON, ``{"version": 1, "answers": {topic: text}}``, written atomically under
a lock, so concurrent saves keep each other's answers.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from posttrainllm import atomic
from posttrainllm.tools import home

VERSION = 1


class AnswersError(ValueError):
    """The answers file cannot be read or written; the message says which file and why."""


def path() -> Path:
    """Where this reader's answers are kept."""
    named = os.environ.get("POSTTRAINLLM_STUDY_ANSWERS")
    return Path(named) if named else home.folder() / "study-answers.json"


def load(file: Path | None = None) -> dict[str, str]:
    """``{topic: answer}``; empty when nothing was saved yet."""
    file = Path(file or path())
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AnswersError(f"cannot read your study answers in {file}: {err}. Nothing was changed; "
                           "move the file aside to start afresh, or set POSTTRAINLLM_STUDY_ANSWERS.") from None
    data = data if isinstance(data, dict) else {}  # a JSON list or number is not an answers file either
    answers = data.get("answers")
    if data.get("version") != VERSION or not isinstance(answers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in answers.items()):
        raise AnswersError(f"{file} is not a study-answers file of version {VERSION} "
                           '({"version": 1, "answers": {topic: text}}); nothing was changed.')
    return answers


@contextlib.contextmanager
def updating(file: Path | None = None) -> Iterator[dict[str, str]]:
    """Yield the answers to change in place; they are written back, whole, when the block ends."""
    file = Path(file or path())
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AnswersError(f"cannot create {file.parent} for your study answers: {err.strerror}") from None
    with atomic.locked(file):
        answers = load(file)
        yield answers
        text = json.dumps({"version": VERSION, "answers": answers}, indent=2, ensure_ascii=False) + "\n"
        atomic.write_text(file, text)
