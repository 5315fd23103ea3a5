"""The reader's study answers live in their own file, not in the clone: saved, shown, exported,
imported, picked up from a clone's queue, and never lost (issue: a `git pull` conflicted with
the reader's answers, which also leaked into contributions and were lost on Colab)."""

import json
import multiprocessing
import os
import shutil
import sys

import pytest

from posttrainllm.tools import answers, study
from posttrainllm.tools.cli import main
from tests.conftest import ROOT

QUEUE = ROOT / "book" / "study-queue.md"


def test_an_answer_goes_to_the_answers_file_and_the_clone_is_untouched():
    before = QUEUE.read_bytes()
    study.fill("Online softmax", "One pass:\nthe max and the sum travel together.")
    assert QUEUE.read_bytes() == before
    assert answers.load() == {"Online softmax": "One pass:\nthe max and the sum travel together."}
    topic = study.find(study.load(), "Online softmax")
    assert topic.filled and topic.why_here == "One pass: the max and the sum travel together."
    with pytest.raises(study.StudyQueueError, match="already has an answer"):
        study.fill("Online softmax", "another")
    study.fill("Online softmax", "another", force=True)
    assert answers.load()["Online softmax"] == "another"


def test_the_answers_file_is_in_the_readers_data_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("POSTTRAINLLM_STUDY_ANSWERS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert answers.path() == tmp_path / "posttrainllm" / "study-answers.json"
    assert not answers.path().is_relative_to(ROOT)


def test_refused_answers_are_not_saved():
    with pytest.raises(study.StudyQueueError, match="HTML tag"):
        study.fill("Online softmax", "see <img src=x onerror=alert(1)>")
    with pytest.raises(study.StudyQueueError, match="no study-queue topic"):
        study.fill("Online softmx", "x")
    assert answers.load() == {}


def _save(name):
    study.fill(name, f"answer for {name}")


def test_concurrent_saves_keep_every_answer():
    names = [t.name for t in study.load()]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_save, names)
    assert answers.load() == {n: f"answer for {n}" for n in names}


def test_export_then_import_into_another_answers_file(tmp_path, monkeypatch):
    study.fill("Logit lens", "It reads the residual stream\nwith the unembedding.")
    exported = tmp_path / "mine.md"
    assert main(["study", "export", "--to", str(exported)]) == 0
    assert "- Why here: It reads the residual stream\n  with the unembedding.\n" in exported.read_text()
    monkeypatch.setenv("POSTTRAINLLM_STUDY_ANSWERS", str(tmp_path / "new" / "answers.json"))
    assert main(["study", "import", str(exported)]) == 0
    assert answers.load() == {"Logit lens": "It reads the residual stream\nwith the unembedding."}
    assert study.text() == exported.read_text()  # the same page, either way


def test_import_keeps_a_different_saved_answer_unless_forced(tmp_path, capsys):
    other = tmp_path / "other.md"
    other.write_text(study.with_answers(QUEUE.read_text(encoding="utf-8"), {"Logit lens": "theirs"}))
    study.fill("Logit lens", "mine")
    assert main(["study", "import", str(other)]) == 2
    assert '"Logit lens"' in capsys.readouterr().err and answers.load() == {"Logit lens": "mine"}
    assert main(["study", "import", str(other), "--force"]) == 0
    assert answers.load() == {"Logit lens": "theirs"}
    unknown = tmp_path / "unknown.md"
    unknown.write_text("## Not a topic\n- Why here: something\n")
    with pytest.raises(study.StudyQueueError, match='"Not a topic"'):
        study.import_answers(unknown)


def test_answers_written_into_a_clone_before_are_picked_up_and_kept_there(tmp_path, monkeypatch):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "book", clone / "book")
    shutil.copytree(ROOT / "notebooks", clone / "notebooks")
    old = clone / "book" / "study-queue.md"
    study.fill("Online softmax", "written by an older version", path=old)
    study.fill("Logit lens", "also old", path=old)
    before = old.read_bytes()
    monkeypatch.setenv("POSTTRAINLLM_ROOT", str(clone))
    assert study.find(study.load(), "Logit lens").why_here == "also old"  # shown before it is copied
    with pytest.raises(study.StudyQueueError, match="already has an answer"):
        study.fill("Logit lens", "newer, in the answers file")
    study.fill("Logit lens", "newer, in the answers file", force=True)
    assert study.adopt_clone_answers() == ["Online softmax"]
    assert study.adopt_clone_answers() == []  # once
    assert answers.load() == {"Logit lens": "newer, in the answers file",
                              "Online softmax": "written by an older version"}
    assert old.read_bytes() == before  # nothing in the clone is lost or changed


def test_a_damaged_answers_file_is_named_and_left_alone(capsys):
    path = answers.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"version": 1, "answers": {"Logit lens": 3}}')
    assert main(["study", "fill", "Logit lens", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "nothing was changed" in err
    assert json.loads(path.read_text())["answers"] == {"Logit lens": 3}


def test_the_book_page_and_the_card_show_the_readers_answers():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from posttrainllm_book import study_queue_page
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    study.fill("Online softmax", "mine, on my own build")
    page = study_queue_page(QUEUE.read_text(encoding="utf-8"))
    assert "- Why here: mine, on my own build" in page and "**1 of 19 topics filled.**" in page
    card = study.card("Online softmax")
    assert card.children[1].value == "mine, on my own build"


def test_fill_writes_through_a_symlinked_queue(tmp_path):
    target = tmp_path / "fork" / "study-queue.md"
    target.parent.mkdir()
    shutil.copyfile(QUEUE, target)
    link = tmp_path / "queue.md"
    link.symlink_to(target)
    study.fill("Online softmax", "through the link", path=link)
    assert link.is_symlink() and study.find(study.load(target), "Online softmax").why_here == "through the link"


def test_outside_a_clone_the_queue_comes_from_the_package(tmp_path, monkeypatch):
    packaged = tmp_path / "assets" / "study-queue.md"
    packaged.parent.mkdir()
    shutil.copyfile(QUEUE, packaged)
    monkeypatch.setattr(study, "repo_root", lambda: (_ for _ in ()).throw(FileNotFoundError()))
    monkeypatch.setattr(study.resources, "files", lambda _: packaged.parent)
    monkeypatch.chdir(tmp_path)
    study.fill("Online softmax", "from a pip install")
    assert study.find(study.load(), "Online softmax").why_here == "from a pip install"
    assert os.listdir(packaged.parent) == ["study-queue.md"]
