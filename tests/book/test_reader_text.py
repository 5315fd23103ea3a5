"""What a reader writes reaches a built page as text, never as markup or code: real Jupyter Book
builds of a small book made with the book's own `_config.yml` and extension (issue: a study answer
holding a Jinja2 template ran a shell command during the build; an HTML tag slipped through)."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from posttrainllm.tools import study
from tests.conftest import ROOT

pytestmark = pytest.mark.book

TEMPLATE = "{{{{ lipsum.__globals__['os'].popen('touch {mark}').read() }}}}"


def _small_book(tmp_path: Path, queue_text: str, extra_page: str) -> Path:
    """The study-queue page and one other, under the book's parse settings and extension."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["sphinx"]["local_extensions"] = {"posttrainllm_book": str(ROOT / "book" / "_ext")}
    config["sphinx"]["config"] = {"nitpicky": True, "posttrainllm_lite_site": False}
    config["html"].pop("favicon", None)
    book = tmp_path / "book-src"
    (book / "book").mkdir(parents=True)
    (book / "_config.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (book / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/study-queue\n",
                                   encoding="utf-8")
    (book / "book" / "intro.md").write_text(f"# Intro\n\n{extra_page}\n", encoding="utf-8")
    (book / "book" / "study-queue.md").write_text(queue_text, encoding="utf-8")
    return book


def _build(book: Path) -> subprocess.CompletedProcess:
    """Not strict: the queue's links point at pages this small book leaves out (the full book's
    strict build checks them)."""
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    return subprocess.run([str(jupyter_book), "build", "--all", str(book)],
                          capture_output=True, text=True, cwd=book)


def test_answers_and_templates_reach_the_page_as_text(tmp_path):
    mark = tmp_path / "template-ran"
    queue = tmp_path / "queue.md"
    queue.write_text((ROOT / "book" / "study-queue.md").read_text(encoding="utf-8"), encoding="utf-8")
    kept = "Because `{{ x }}` and x < y are text, see https://arxiv.org/abs/1805.02867"
    study.fill("Online softmax", kept, path=queue)
    for hostile in (TEMPLATE.format(mark=mark), "\\`<img src=x onerror=alert(1)>\\`"):
        with pytest.raises(study.StudyQueueError, match="was not saved"):
            study.fill("Logit lens", hostile, path=queue)
    # the template on a page of the book itself: no substitution extension, so it stays text
    book = _small_book(tmp_path, queue.read_text(encoding="utf-8"), TEMPLATE.format(mark=mark))
    done = _build(book)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not mark.exists(), "a template in a page ran code during the build"
    html = book / "_build" / "html" / "book"
    assert "<p>{{ lipsum." in (html / "intro.html").read_text(encoding="utf-8")  # shown, not run
    page = (html / "study-queue.html").read_text(encoding="utf-8")
    assert "<code class=\"docutils literal notranslate\"><span class=\"pre\">{{</span>" in page
    assert "x &lt; y are text" in page and "<img src=x" not in page


def test_a_hand_edited_answer_with_html_stops_the_build_with_its_topic(tmp_path):
    text = (ROOT / "book" / "study-queue.md").read_text(encoding="utf-8")
    field = study.find(study.parse(text), "Logit lens").fields["Why here"]
    lines = text.splitlines(keepends=True)
    lines[field.start] = "- Why here: \\`<img src=x onerror=alert(1)>\\`\n"
    book = _small_book(tmp_path, "".join(lines), "Nothing here.")
    done = _build(book)
    log = done.stdout + done.stderr
    assert done.returncode != 0
    assert '"Logit lens": the "Why here" answer cannot go on the page: it holds an HTML tag' in log
    page = book / "_build" / "html" / "book" / "study-queue.html"
    assert not page.exists() or "onerror" not in page.read_text(encoding="utf-8")
