"""The built book in headless Chromium, served on 127.0.0.1, with every other host blocked.

For each page: it renders with no console errors, its math is typeset by the vendored MathJax,
its widgets are drawn by the vendored ipywidgets manager, and no request left the machine.
"""

import functools
import http.server
import json
import threading
from urllib.parse import urlparse

import pytest
import yaml

from posttrainllm import webgpu
from tests.book.conftest import BUILD
from tests.conftest import ROOT, chromium_path, require

FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]


WEBGPU_FLAGS = [f for f in FLAGS if f != "--disable-gpu"] + ["--enable-unsafe-webgpu"]  # SwiftShader's WebGPU
WEBGPU_CELLS = {"notebooks/03-tensors.html": "matmul", "notebooks/07-attention.html": "attention"}


def _pages():
    """Every page of the table of contents, plus the index and search pages Sphinx adds."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"], *(ch["file"] for part in toc["parts"] for ch in part["chapters"])]
    return [f"{f}.html" for f in files] + ["genindex.html", "search.html"]


@pytest.fixture(scope="module")
def browser(playwright, site):
    yield from _launch(playwright, FLAGS)


def _launch(playwright, flags):
    chromium = chromium_path()
    require(chromium is not None, "Debian's chromium (apt-get install chromium)")
    # Playwright gives every launch a fresh, empty profile (its own user-data dir).
    b = playwright.chromium.launch(executable_path=chromium, args=flags)
    yield b
    b.close()


@pytest.fixture(scope="module")
def webgpu_browser(playwright, site):
    yield from _launch(playwright, WEBGPU_FLAGS)


@pytest.fixture(scope="module")
def plain_site(built_book):
    """The built book from a plain static server: no cross-origin isolation headers, as on a
    static host such as GitHub Pages."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(BUILD / "html")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def block_other_hosts(context) -> list[str]:
    """Abort every request of ``context`` that would leave 127.0.0.1; returns the list of their URLs."""
    external = []

    def gate(route):
        url = route.request.url
        if url.startswith(("data:", "blob:")) or urlparse(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            external.append(url)
            route.abort()

    context.route("**/*", gate)
    return external


def _visitor(browser, base):
    """Open a page; return (page, console errors, requests that tried to leave 127.0.0.1)."""
    opened = []

    def _visit(path):
        context = browser.new_context()
        external, errors = block_other_hosts(context), []
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/{path}", wait_until="networkidle")
        opened.append(context)
        return page, errors, external

    return _visit, opened


@pytest.fixture(scope="module")
def visit(browser, site):
    _visit, opened = _visitor(browser, site)
    yield _visit
    for context in opened:
        context.close()


@pytest.mark.parametrize("path", _pages())
def test_page_renders_offline_with_no_errors(visit, path):
    page, errors, external = visit(path)
    assert external == [], f"{path} tried to reach another host: {external}"
    assert errors == [], f"{path} logged errors: {errors}"
    assert page.title() and page.locator("main, article, body").first.inner_text().strip()
    source = (BUILD / "html" / path).read_text(encoding="utf-8")
    if 'class="math' in source:
        page.wait_for_selector("mjx-container", timeout=15000)
        assert page.locator("mjx-container").count() > 0
    if "application/vnd.jupyter.widget-view+json" in source:
        page.wait_for_selector(".jupyter-widgets", timeout=15000)
        assert "Error displaying widget" not in page.content()


def test_notebook_widgets_show_sliders_pictures_and_study_cards(visit):
    page, errors, _ = visit("notebooks/01-from-a-line.html")
    page.wait_for_selector(".widget-slider", timeout=15000)
    assert page.locator(".widget-slider").count() == 2
    image = page.locator(".widget-image").first
    assert image.evaluate("img => img.complete && img.naturalWidth > 100")
    assert page.locator(".widget-textarea").count() == 1 and page.get_by_text("Study card:").count() == 1
    assert errors == []


def test_a_study_card_on_the_static_page_keeps_the_answer_and_gives_the_command(visit):
    page, errors, _ = visit("notebooks/01-from-a-line.html")
    page.wait_for_selector(".widget-textarea textarea", timeout=15000)
    page.locator(".widget-textarea textarea").fill("It's where the loss starts.")
    page.get_by_role("button", name="Save").click()
    command = page.locator(".ptl-static-command").inner_text()
    topic = page.locator(".widget-vbox p b", has_text="Study card:").locator("..").inner_text()
    topic = topic.replace("Study card:", "").strip()
    assert command == f"posttrainllm study fill '{topic}' 'It'\\''s where the loss starts.'"
    page.reload()  # the answer survives in this browser
    page.wait_for_selector(".widget-textarea textarea", timeout=15000)
    page.wait_for_function("document.querySelector('.widget-textarea textarea').value !== ''", timeout=15000)
    assert page.locator(".widget-textarea textarea").input_value() == "It's where the loss starts."
    # and each slider says that its figure was drawn at build time
    assert page.locator(".ptl-static-slider-note").count() >= 1
    assert errors == []


def _cell(page, kind):
    cell = page.locator(f".ptl-webgpu[data-kind={kind}]")
    assert cell.count() == 1, f"no {kind} WebGPU cell on the page"
    page.wait_for_function("e => !['starting', undefined].includes(e.dataset.state)", arg=cell.element_handle(),
                           timeout=30000)
    return cell


@pytest.mark.parametrize("server", ["isolated", "plain static host"])
@pytest.mark.parametrize("path", sorted(WEBGPU_CELLS))
def test_webgpu_cells_run_on_the_page_and_match_the_cpu(webgpu_browser, site, plain_site, server, path):
    _visit, opened = _visitor(webgpu_browser, site if server == "isolated" else plain_site)
    try:
        page, errors, external = _visit(path)
        cell = _cell(page, WEBGPU_CELLS[path])
        status = cell.locator(".ptl-status")
        assert cell.get_attribute("data-state") == "ready", status.inner_text()
        assert "software (CPU) adapter" in status.inner_text()  # SwiftShader says what its times mean
        assert cell.locator("select").input_value() == "small"  # a software adapter starts small
        cell.locator("select").select_option("small")
        cell.locator("button.ptl-run").click()
        page.wait_for_function("e => ['done', 'error'].includes(e.dataset.state)", arg=cell.element_handle(),
                               timeout=240000)
        assert cell.get_attribute("data-state") == "done", status.inner_text()
        results = json.loads(cell.get_attribute("data-results"))
        timed = [r for r in results if "skipped" not in r]
        assert timed and all(r["ok"] for r in timed), [r for r in timed if not r["ok"]]
        assert all(r["ms"] > 0 for r in timed)
        if WEBGPU_CELLS[path] == "matmul":
            assert {r["n"] for r in results} == {64, 128, 256}
            assert {r["kernel"] for r in timed} >= {"naive", "tiled 16x16", "vec4, register 8x8"}
            skipped = [r for r in results if "skipped" in r]  # SwiftShader has no shader-f16: said, not hidden
            assert skipped and all("shader-f16" in r["skipped"] for r in skipped)
            assert page.get_by_text("needs shader-f16").count() == len(skipped)
        else:
            kernels = [v["name"] for v in webgpu.variants("attention")]
            assert {(r["t"], r["kernel"]) for r in timed} == {(t, k) for t in (64, 128, 256) for k in kernels}
            assert cell.locator("svg polyline").count() == len(kernels)
        assert "Every result matched the CPU" in status.inner_text()
        assert errors == [] and external == []
    finally:
        for context in opened:
            context.close()


def test_a_webgpu_race_stops_when_asked(webgpu_browser, site):
    _visit, opened = _visitor(webgpu_browser, site)
    try:
        page, errors, _ = _visit("notebooks/03-tensors.html")
        cell = _cell(page, "matmul")
        cell.locator("select").select_option("large")  # minutes on SwiftShader: only Stop ends it soon
        cell.locator("button.ptl-run").click()
        cell.locator("button.ptl-stop").click()
        page.wait_for_function("e => e.dataset.state !== 'running'", arg=cell.element_handle(), timeout=120000)
        assert cell.get_attribute("data-state") == "stopped"
        assert "Stopped by you" in cell.locator(".ptl-status").inner_text()
        assert len(json.loads(cell.get_attribute("data-results"))) < 2 * 6  # not both sizes' six kernels
        assert cell.locator("button.ptl-run").is_enabled() and cell.locator("button.ptl-stop").is_disabled()
        assert errors == []
    finally:
        for context in opened:
            context.close()


@pytest.mark.parametrize("path", sorted(WEBGPU_CELLS))
def test_webgpu_cells_explain_themselves_without_webgpu(visit, path):
    page, errors, _ = visit(path)  # the default browser runs with --disable-gpu: no adapter
    cell = _cell(page, WEBGPU_CELLS[path])
    assert cell.get_attribute("data-state") == "unavailable"
    message = cell.locator(".ptl-status").inner_text()
    assert "WebGPU" in message and "no GPU adapter" in message
    assert cell.locator("button.ptl-run").is_disabled()
    assert errors == []


WASM_PAGE = "notebooks/07-attention.html"


def wasm_cell(page):
    cell = page.locator(".ptl-wasm")
    assert cell.count() == 1, "no WASM trainer cell on the page"
    page.wait_for_function("document.querySelector('.ptl-wasm')?.dataset.state === 'ready'", timeout=180000)
    cell.scroll_into_view_if_needed()  # JupyterLab does not render cells outside the viewport
    return cell


def train_wasm_cell(page, oracle, steps="10", stop_after=None):
    """Train in the cell; check the loss falls and its first steps match the oracle's. With
    ``stop_after``, press Stop once that many steps are done. Returns the cell's results."""
    cell = wasm_cell(page)
    cell.locator(".ptl-steps").select_option(steps)
    cell.locator(".ptl-train").click()
    if stop_after is not None:
        page.wait_for_function(f"(document.querySelector('.ptl-stats')?.textContent ?? '').match(/step (\\d+)/)?.[1]"
                               f" >= {stop_after}", timeout=120000)
        cell.locator(".ptl-stop").click()
    page.wait_for_function("e => ['done', 'error'].includes(e.dataset.state)", arg=cell.element_handle(),
                           timeout=240000)
    status = cell.locator(".ptl-status").text_content()
    assert cell.get_attribute("data-state") == "done", status
    run = json.loads(cell.get_attribute("data-results"))
    losses = run["losses"]
    assert len(losses) >= len(oracle) and losses[-1] < losses[0] - 0.5, losses
    drift = max(abs(a - b) for a, b in zip(losses, oracle, strict=False))
    assert drift < 1e-4, f"the browser's losses {losses[:10]} drift {drift:.1e} from the oracle's {oracle}"
    assert run["sample"].startswith("Once there was") and len(run["sample"]) > 40
    assert cell.locator(".ptl-sample").text_content() == run["sample"]
    assert cell.locator(".ptl-loss-plot circle").count() == len(oracle)  # the oracle's dots, beside the curve
    return run, status


def test_wasm_cell_trains_on_threads_when_the_host_isolates_the_page(visit, wasm_oracle):
    page, errors, external = visit(WASM_PAGE)  # `make book`'s server sends COOP/COEP
    assert page.evaluate("crossOriginIsolated")
    cell = wasm_cell(page)
    assert "threaded relaxed-SIMD build" in cell.locator(".ptl-status").inner_text()  # Chromium has relaxed SIMD
    assert cell.locator(".ptl-threads-note").count() == 0
    run, status = train_wasm_cell(page, wasm_oracle)
    assert run["build"] == "relaxed-threads" and run["threads"] >= 2 and run["tokensPerSecond"] > 0
    assert "Done after 10 steps" in status
    assert errors == [] and external == []


def test_wasm_cell_on_a_static_host_says_why_one_thread_and_its_service_worker_isolates(browser, plain_site,
                                                                                        wasm_oracle):
    _visit, opened = _visitor(browser, plain_site)
    try:
        page, errors, external = _visit(WASM_PAGE)
        assert not page.evaluate("crossOriginIsolated")
        cell = wasm_cell(page)
        note = cell.locator(".ptl-threads-note").inner_text()
        assert "not cross-origin isolated" in note and "one thread" in note
        run, _ = train_wasm_cell(page, wasm_oracle)  # still trains: one thread, relaxed SIMD
        assert run["build"] == "relaxed" and run["threads"] == 1
        with page.expect_navigation(timeout=30000):
            cell.locator(".ptl-isolate").click()  # installs coi-sw.js, then reloads
        assert page.evaluate("crossOriginIsolated"), "the service worker did not isolate the page"
        assert wasm_cell(page).locator(".ptl-threads-note").count() == 0
        run, status = train_wasm_cell(page, wasm_oracle, steps="300", stop_after=12)
        assert run["build"] == "relaxed-threads" and run["threads"] >= 2
        assert status.startswith("Stopped after") and len(run["losses"]) < 300
        assert errors == [] and external == []
    finally:
        for context in opened:
            context.close()
