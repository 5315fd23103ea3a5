"""Every notebook keeps its promises to the reader: every "write it" exercise is a skeleton, the
book's answer comes only after it and folded both on the page and in JupyterLab, no solution is
defined under the reader's name, and the notebook ends with the module's line of the reader's
record."""

import re

import nbformat
import pytest

from posttrainllm.tools import mastery
from tests.conftest import ROOT
from tests.exercises import folded

NOTEBOOKS = {int(p.name[:2]): p for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")}


def _cells(module: int):
    return nbformat.read(NOTEBOOKS[module], as_version=4).cells


@pytest.mark.parametrize("module", sorted(NOTEBOOKS))
def test_each_write_it_exercise_is_a_skeleton_whose_answer_comes_after_itfolded(module):
    cells = [c for c in _cells(module) if c.cell_type == "code"]
    gates = [g for g, (m, kind) in mastery.GATES.items() if m == module and kind == mastery.WRITE]
    for gate in gates:
        calls = [i for i, c in enumerate(cells) if re.search(rf"\bmastery\.{gate}\(", c.source)]
        exercise = [i for i in calls if not folded(cells[i])]
        answers = [i for i in calls if folded(cells[i])]
        assert len(exercise) == 1 and answers, f"{gate}: one exercise cell and its folded answer"
        assert "raise NotImplementedError" in cells[exercise[0]].source, f"{gate}'s exercise is not a skeleton"
        assert "solutions." in cells[answers[0]].source and answers[0] > exercise[0]
        shown = [i for i, c in enumerate(cells) if "solutions." in c.source and "show_source" in c.source]
        assert all(folded(cells[i]) for i in shown), "an answer's source is shown unfolded"


@pytest.mark.parametrize("module", sorted(NOTEBOOKS))
def test_answers_are_folded_in_jupyterlab_too_and_never_take_the_readers_names(module):
    cells = _cells(module)
    answers = [c for c in cells if folded(c)]
    assert answers
    for cell in answers:
        assert cell.metadata.get("jupyter") == {"source_hidden": True, "outputs_hidden": True}, cell.source
        assert not re.search(r"^(def|class) \w+", cell.source, flags=re.M), f"an answer defines a name: {cell.source}"
    reader_names = {m for c in cells if c.cell_type == "code" and not folded(c)
                    for m in re.findall(r"^(?:def|class) (\w+)", c.source, flags=re.M)}
    assert not any(re.search(rf"^{name}\s*=", c.source, flags=re.M) for c in answers for name in reader_names)


@pytest.mark.parametrize("module", sorted(NOTEBOOKS))
def test_the_notebook_ends_with_the_modules_line_of_the_readers_record(module):
    code = [c for c in _cells(module) if c.cell_type == "code"]
    assert code[-1].source == f"print(mastery.progress({module}))"
    stored = "".join(o.get("text", "") for o in code[-1].outputs)
    assert stored == mastery.progress(module) + "\n"  # this test's record is empty, as the notebook run's was
    assert stored.startswith(f"Module {module}: 0 of ")


@pytest.mark.parametrize("module", sorted(NOTEBOOKS))
def test_the_curriculum_says_the_reader_builds_each_piece_the_notebook_asks_for(module):
    text = (ROOT / "book" / "curriculum.md").read_text(encoding="utf-8")
    section = re.search(rf"^## Module {module}:(.*?)(?=^## |\Z)", text, flags=re.M | re.S)[1]
    you_build = section.split("**You build:**")[1].split("- **Mastery gates:**")[0]
    assert "skeleton" in you_build
    for gate, (m, kind) in mastery.GATES.items():
        if m == module and kind == mastery.WRITE:
            name = mastery.describe(gate).split("`")[1].split("(")[0]
            assert f"`{name}" in you_build, f"module {module}'s 'You build' does not name {name} ({gate})"
