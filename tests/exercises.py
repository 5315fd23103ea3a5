"""Helpers for the tests of a notebook's exercises: find each exercise's own cell, run cells as
the notebook would, and run the whole notebook with a reader's answers typed in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from posttrainllm.tools import mastery, record


def folded(cell) -> bool:
    """A cell that holds the book's answer: folded on the page and in JupyterLab."""
    return "hide-cell" in cell.metadata.get("tags", [])


def exercise_cells(nb, calls: dict[str, str]) -> dict[str, int]:
    """``{name: index}`` of the unfolded cell that makes each call (``"check_encode(encode_chunk)"``)."""
    found = {}
    for i, cell in enumerate(nb.cells):
        for name, call in calls.items():
            if cell.cell_type == "code" and not folded(cell) and f"mastery.{call}" in cell.source:
                found[name] = i
    return found


def assert_skeletons_are_not_written_yet(path: Path, calls: dict[str, str], functions: dict[str, str],
                                         run: Callable[[list[str]], dict]) -> None:
    """Each exercise cell of the notebook defines a skeleton that its gate calls "not written yet",
    with the first step to write, and the notebook stored exactly that report."""
    nb = nbformat.read(path, as_version=4)
    cells = exercise_cells(nb, calls)
    assert set(cells) == set(calls)
    for gate, function in functions.items():
        namespace = run([nb.cells[cells[gate]].source])
        result = getattr(mastery, f"check_{gate}")(namespace[function])
        assert not result and result.first == mastery.FIRST[gate], gate
        stored = "".join(o.get("data", {}).get("text/plain", "") for o in nb.cells[cells[gate]].outputs)
        assert stored == repr(result), gate


def assert_readers_answers_pass_and_only_they_are_recorded(functions: dict[str, str], solutions,
                                                          answers: dict[str, str],
                                                          run: Callable[[list[str]], dict]) -> None:
    """The book's solutions pass each gate without entering the record; the reader's own answers
    (``answers``, the cells they type) pass it and do."""
    for gate, function in functions.items():
        assert getattr(mastery, f"check_{gate}")(getattr(solutions, function)), gate
    assert record.load() == set()
    namespace = run([answers[gate] for gate in functions])
    for gate, function in functions.items():
        assert getattr(mastery, f"check_{gate}")(namespace[function]), gate
    assert record.load() == set(functions)


def run_cells(sources: list[str], **names) -> dict:
    """Execute cell sources in order in one namespace holding ``mastery`` and ``names``."""
    namespace = {"mastery": mastery, **names}
    for source in sources:
        exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - the notebook's or a reader's cells
    return namespace


def run_with_answers(path: Path, answers: dict[str, str], calls: dict[str, str], until: str | None = None,
                     given: dict[str, str] | None = None) -> str:
    """Run the notebook with each exercise cell replaced by the reader's answer; all its text output.

    The notebook's own nbval run covers the cells that do not use the reader's code, so two
    options leave the slow ones out: with ``until``, the run stops before the first cell whose
    source holds it; ``given`` maps a text in a cell's source to the source that stands in for
    that cell (the figures it stored, for the cells after it)."""
    nb = nbformat.read(path, as_version=4)
    for name, index in exercise_cells(nb, calls).items():
        nb.cells[index].source = answers[name]
    for marker, source in (given or {}).items():
        [cell] = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
        cell.source = source
    if until is not None:
        nb.cells = nb.cells[:next(i for i, c in enumerate(nb.cells) if until in c.source)]
    NotebookClient(nb, timeout=300, resources={"metadata": {"path": str(path.parent)}}).execute()
    return "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
