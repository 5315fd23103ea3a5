"""The stored notebooks themselves: executed, error-free, budgeted, and importing (not pasting) the package."""

import inspect
import json
import re

import pytest

import posttrainllm
from posttrainllm.tools import coverage
from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code_cells(path):
    return [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks_numbered_in_module_order():
    names = [p.name for p in NOTEBOOKS]
    assert names[:2] == ["01-from-a-line.ipynb", "02-gradient-descent.ipynb"]
    assert all(re.match(r"\d\d-[a-z0-9-]+\.ipynb$", n) for n in names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_was_executed_in_order_and_stored(path):
    cells = [c for c in _code_cells(path) if "".join(c["source"]).strip()]
    counts = [c["execution_count"] for c in cells]
    assert None not in counts, f"{path.name}: a code cell has no stored output; run `make notebooks`"
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: cells were run out of order"
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name}: a stored output is an error"


# A rate, a duration or a speed-up measured by the clock: a stored output must not carry one (the
# benchmarks under benchmarks/ do), since nbval could only compare it by masking it.
TIMING = re.compile(r"\d[\d,.]*\s*(?:[GT]FLOP/s|[GM]B/s|tokens/s|ms\b|seconds\b)|\d[\d.]*x (?:faster|slower)")


def _printed(cell) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell["outputs"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_stored_output_is_a_timing(path):
    timings = [m.group(0) for c in _code_cells(path) for m in TIMING.finditer(_printed(c))]
    assert not timings, f"{path.name} stores figures that depend on the clock: {timings}"


def test_the_timing_pattern_catches_what_the_notebooks_once_printed():
    for printed in ("compute peak P: 190.1 GFLOP/s", "tensor engine 42x faster", "1.4x faster than the target",
                    "memory bandwidth W: 13.7 GB/s", "took 0.25 seconds", "3.1 ms per step"):
        assert TIMING.search(printed), printed
    assert not TIMING.search("intensity 0.50 FLOP/byte; 707 times fewer; 48.00 MiB")


# The most each module's issue allows on 2 cores; module 10 is 120 s plus 60 s for its GRPO part.
MAX_BUDGET_S = {"07": 90, "08": 90, "09": 90, "10": 180}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_declares_a_budget_and_opens_with_where_we_start(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert 0 < nb["metadata"]["posttrainllm"]["budget_s"] <= MAX_BUDGET_S.get(path.name[:2], 120)
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("# Module ") and "Where we're starting" in first


def _package_source_lines() -> set[str]:
    lines = set()
    for name in set(coverage.package_modules()) - {"__main__"}:
        module = __import__(f"posttrainllm.{name}", fromlist=["_"])
        for line in inspect.getsource(module).splitlines():
            stripped = line.strip()
            if len(stripped) > 25 and not stripped.startswith(("#", '"""', "import", "from")):
                lines.add(stripped)
    return lines


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_imports_the_package_and_pastes_none_of_it(path):
    cells = ["".join(c["source"]) for c in _code_cells(path)]
    assert any(re.search(r"^from posttrainllm|^import posttrainllm", c, re.M) for c in cells)
    package = _package_source_lines()
    for cell in cells:
        run = 0
        for line in cell.splitlines():
            run = run + 1 if line.strip() in package else 0
            assert run < 4, f"{path.name} repeats package code verbatim near: {line.strip()!r}"
    assert posttrainllm.__file__.startswith(str(ROOT)), "the package must be installed from this checkout"
