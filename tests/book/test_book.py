"""The strict book build, and what it must contain."""

import re

import pytest

from tests.book.conftest import BUILD


def test_book_builds_strictly_with_warnings_as_errors(built_book):
    returncode, log = built_book
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert returncode == 0 and not warnings, "\n".join(warnings[:20]) or log[-3000:]


def test_every_page_of_the_toc_is_built(built_book):
    html = BUILD / "html"
    for page in ["book/intro", "book/curriculum", "book/study-queue", "book/coverage", "book/notebook-times",
                 "book/references", "book/llm-mechanics", "notebooks/01-from-a-line", "notebooks/02-gradient-descent"]:
        assert (html / f"{page}.html").is_file(), page


def test_study_queue_page_shows_each_topics_status_and_links(built_book):
    page = (BUILD / "html" / "book" / "study-queue.html").read_text(encoding="utf-8")
    assert page.count("<strong>Status:</strong> TBD") + page.count("<strong>Status:</strong> filled") == 19
    assert re.search(r"\d+ of 19 topics filled", page)
    assert 'href="../notebooks/02-gradient-descent.html#a-plateau-that-looks-like-a-ceiling"' in page


def test_coverage_and_timing_pages_are_generated_from_this_build(built_book, budget_report):
    coverage = (BUILD / "html" / "book" / "coverage.html").read_text(encoding="utf-8")
    assert "posttrainllm.gradient_descent" in coverage and "not taught yet" not in coverage
    times = (BUILD / "html" / "book" / "notebook-times.html").read_text(encoding="utf-8")
    for name, entry in budget_report["notebooks"].items():
        assert name in times and f"{entry['seconds']:.1f}" in times


def test_pages_reference_no_other_host_for_scripts_or_styles(built_book):
    for page in (BUILD / "html").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        assert not remote, f"{page.name} loads {remote}"


def test_the_mechanics_chapter_was_executed_by_the_build(built_book):
    page = (BUILD / "html" / "book" / "llm-mechanics.html").read_text(encoding="utf-8")
    assert "changing token 0 moves logits up to position 9; L(W-1) = 9" in page
    assert re.search(r"top-1 aux=0.01: busiest expert 1\.\d\dx its fair share", page)
    assert page.count('<img alt="_images/') + page.count('src="../_images/') >= 3  # its figures


def test_no_page_shows_a_markdown_table_as_text(built_book):
    """A table a cell displays as Markdown must render as a table, not as a paragraph of pipes."""
    row = re.compile(r"<p>\s*\|[^<\n]*\|\s*$", re.M)
    pages = [p for p in (BUILD / "html").rglob("*.html") if "lite" not in p.relative_to(BUILD / "html").parts]
    shown = [p.relative_to(BUILD / "html").as_posix() for p in pages if row.search(p.read_text(encoding="utf-8"))]
    assert shown == []


@pytest.mark.parametrize("page, computed", [
    ("training-at-scale", r"ZeRO-1 +31\.4 GB per device \(paper: 31\.4\)"),
    ("post-training-data", r"flagged: 400 of 400 junk answers, 0 of 3\d{3} real ones"),
    ("reward-models", r"teacher 137,152 parameters, student 31,296 \(4\.4x fewer\)"),
    ("inference-serving", r"512 KiB per token; a 4096-token request holds 2\.0 GiB"),
    ("evals-and-failures", r"\d+ dirty and \d+ clean questions"),
    ("interpretability", r"previous-token head: \(0, \d\), score 0\.\d\d"),
])
def test_each_reference_shelf_chapter_was_executed_by_the_build(built_book, page, computed):
    html = (BUILD / "html" / "book" / f"{page}.html").read_text(encoding="utf-8")
    assert re.search(computed, html), f"{page}: the computed line {computed!r} is not on the page"
    assert html.count('src="../_images/') + html.count('<img alt="_images/') >= 1  # its figures
