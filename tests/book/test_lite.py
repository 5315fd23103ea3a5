"""The browser editions (posttrainllm.tools.lite, book/_ext/lite_site.py): tagged correctly, linked
from exactly the pages that can run, and run by the real Pyodide kernel in headless Chromium
with every request that would leave 127.0.0.1 blocked."""

import json
import re

import pytest

from posttrainllm.tools import lite
from tests.book.conftest import BUILD
from tests.book.lite_check import html_of, pure_notebook, run_edition, run_pure, text_of
from tests.book.test_browser import FLAGS, _launch, block_other_hosts
from tests.conftest import ROOT

NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
KERNEL_IDLE = """() => { const w = window.jupyterapp?.shell.currentWidget;
  const k = w?.sessionContext?.session?.kernel; return !!k && k.status === "idle"; }"""


@pytest.mark.parametrize("stem", lite.IN_BROWSER)
def test_each_browser_edition_prints_what_the_notebook_stored_without_pytorch(stem):
    assert run_edition(ROOT / "notebooks" / f"{stem}.ipynb") == []


def test_the_pure_python_cells_need_nothing_but_the_standard_library():
    assert run_pure() == []


def test_every_notebook_with_a_browser_edition_exists_and_the_pure_cells_are_there():
    assert set(lite.IN_BROWSER) <= set(NOTEBOOKS)
    nb, expected, html = pure_notebook()
    # the comparison is not vacuous: most cells print (the import cells and study cards do not)
    assert len(nb.cells) >= 15 and sum(map(bool, expected)) >= 12
    # and the browser cells of modules 3 and 7 are among them, with the kernels they inline
    inlined = [h for cell_html in html for h in cell_html if "ptl-webgpu" in h]
    assert len(inlined) == 2 and all("@compute" in h for h in inlined)


def test_an_edition_replaces_the_pytorch_cells_by_a_note_and_keeps_their_code():
    nb = json.loads((ROOT / "notebooks" / "04-backprop.ipynb").read_text())
    edition = lite.edition(nb)
    skipped = [c for c in nb["cells"] if lite.SKIP_TAG in c["metadata"].get("tags", [])]
    notes = [c for c in edition["cells"] if "Left out in the browser" in "".join(c["source"])]
    assert skipped and len(notes) == len(skipped)
    assert all("".join(s["source"]).strip() in n["source"] for s, n in zip(skipped, notes, strict=True))
    assert not any(c.get("outputs") for c in edition["cells"])
    assert edition["cells"][2]["source"] == lite.SETUP and "widgets" not in edition["metadata"]


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_the_launch_link_is_on_exactly_the_pages_that_run(built_book, stem):
    assert built_book[0] == 0, "the book did not build"
    page = (BUILD / "html" / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
    links = re.findall(r'class="ptl-lite-link" href="([^"]+)"', page)
    if stem in lite.IN_BROWSER:
        assert links == [f"../lite/notebooks/index.html?path=notebooks/{stem}.ipynb"]
        edition = json.loads((BUILD / "html" / "lite" / "files" / "notebooks" / f"{stem}.ipynb").read_text())
        assert "".join(edition["cells"][2]["source"]) == lite.SETUP
        assert "Needs PyTorch" not in page
    else:
        assert links == [] and "Needs PyTorch" in page and "make lab" in page
        assert not (BUILD / "html" / "lite" / "files" / "notebooks" / f"{stem}.ipynb").exists()


# --- the real Pyodide kernel, offline ------------------------------------------------------------


@pytest.fixture(scope="module")
def offline(playwright, site):
    """A page factory whose requests may reach only the book's server; returns (page, external)."""
    browser = next(_launch(playwright, FLAGS))
    contexts = []

    def open_page(path):
        context = browser.new_context()
        external = block_other_hosts(context)
        contexts.append(context)
        page = context.new_page()
        page.goto(f"{site}/{path}")
        return page, external

    yield open_page
    for context in contexts:
        context.close()
    browser.close()


def _wait_for_kernel(page):
    page.wait_for_function(KERNEL_IDLE, timeout=180_000, polling=500)


def test_the_pure_python_cells_run_offline_in_pyodide_as_stored(offline):
    page, external = offline("lite/lab/index.html")
    page.wait_for_function("() => !!window.jupyterapp?.commands.hasCommand('docmanager:open')", timeout=60_000)
    nb, expected, html = pure_notebook()
    page.evaluate(
        """async (nb) => { const app = window.jupyterapp;
             await app.serviceManager.contents.save("notebooks/pure-python.ipynb",
                                                     {type: "notebook", format: "json", content: nb});
             await app.commands.execute("docmanager:open", {path: "notebooks/pure-python.ipynb"}); }""",
        nb,
    )
    _wait_for_kernel(page)
    # served without isolation headers (posttrainllm.tools.serve.NOT_ISOLATED), as on a static host
    assert page.evaluate("() => crossOriginIsolated") is False
    # not awaited here: the wait below bounds it
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    outputs = page.wait_for_function(
        """(n) => { const w = window.jupyterapp.shell.currentWidget; const k = w.sessionContext.session.kernel;
             const cells = [...w.content.model.cells];
             if (k.status !== "idle" || cells.length !== n || cells.some((c) => !c.executionCount)) return null;
             return cells.map((c) => c.outputs.toJSON()); }""",
        arg=len(expected), timeout=300_000, polling=1000,
    ).json_value()
    got = [text_of(out) for out in outputs]
    assert got == expected
    # modules 3 and 7's browser cells, built in Pyodide from the kernels inside the site's wheel
    assert [html_of(out) for out in outputs] == html
    assert external == [], f"the offline path tried to reach: {external}"


def test_a_browser_edition_offline_says_the_cdn_packages_need_the_network(offline):
    page, external = offline("lite/notebooks/index.html?path=notebooks/01-from-a-line.ipynb")
    _wait_for_kernel(page)
    error = page.evaluate(
        """async (code) => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
             let error = null; const f = k.requestExecute({code});
             f.onIOPub = (m) => { if (m.header.msg_type === "error") error = m.content; };
             await f.done; return error; }""",
        lite.SETUP,
    )
    assert error and "RuntimeError" in error["ename"], error
    assert "could not load numpy, matplotlib from the Pyodide CDN" in error["evalue"]
    assert "make lab" in error["evalue"] and "micrograd" in error["evalue"]
    assert any("cdn.jsdelivr.net/pyodide/" in url for url in external), external


def test_the_repl_on_the_reference_page_starts_offline(offline):
    page, external = offline("book/in-your-browser.html")
    page.click(".ptl-repl-start")
    frame = page.frame_locator(".ptl-repl iframe")
    frame.get_by_text(re.compile(r"Value\(1, grad=1\) 0\.000122882\d+")).wait_for(timeout=180_000)
    assert external == []
