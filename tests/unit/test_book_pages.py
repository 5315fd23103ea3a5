"""The generated parts of the book's pages (book/_ext/posttrainllm_book.py), without a build."""

import importlib.util
import json
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def pages():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))  # as Sphinx loads it: beside lite_site.py
    spec = importlib.util.spec_from_file_location("posttrainllm_book", ROOT / "book" / "_ext" / "posttrainllm_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_build_without_tests_shows_the_committed_timing_report(pages, monkeypatch, tmp_path):
    monkeypatch.setattr(pages, "TIMES", tmp_path / "absent.json")
    committed = json.loads(pages.COMMITTED_TIMES.read_text())
    table = pages.notebook_times_table()
    assert committed["measured"] in table and "this build ran no tests" in table
    names = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(committed["notebooks"]) == names, "refresh book/notebook-times.json: make test, then make notebook-times"
    assert all(f"| {name} |" in table for name in names)


def test_a_build_after_make_test_shows_its_own_report(pages, monkeypatch, tmp_path):
    report = {"machine": "m", "fail_factor": 3.0, "notebooks": {"01-x.ipynb": {"seconds": 5.0, "budget_s": 60}}}
    (tmp_path / "times.json").write_text(json.dumps(report))
    monkeypatch.setattr(pages, "TIMES", tmp_path / "times.json")
    table = pages.notebook_times_table()
    assert "during this build's `make test`" in table and "| 01-x.ipynb | 60 | 5.0 | 8% |" in table


def test_benchmark_sections_get_short_headings(pages):
    assert pages.short_title("WGSL matmul on NVIDIA H200 (DiscreteGPU, Vulkan)") == "WGSL matmul on NVIDIA H200"
    assert pages.short_title("Training the GPT (60 steps): WASM beside PyTorch") == "Training the GPT"
