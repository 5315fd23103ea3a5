"""The built book in headless Chromium, served on 127.0.0.1, with every other host blocked.

For each page: it renders with no console errors, its math is typeset by the vendored MathJax,
its widgets are drawn by the vendored ipywidgets manager, and no request left the machine.
"""

from urllib.parse import urlparse

import pytest
import yaml

from tests.book.conftest import BUILD
from tests.conftest import ROOT, chromium_path, require

FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]


def _pages():
    """Every page of the table of contents, plus the index and search pages Sphinx adds."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"], *(ch["file"] for part in toc["parts"] for ch in part["chapters"])]
    return [f"{f}.html" for f in files] + ["genindex.html", "search.html"]


@pytest.fixture(scope="module")
def browser(site):
    chromium = chromium_path()
    require(chromium is not None, "Debian's chromium (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        # Playwright gives every launch a fresh, empty profile (its own user-data dir).
        b = p.chromium.launch(executable_path=chromium, args=FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def visit(browser, site):
    """Open a page; return (page, console errors, requests that tried to leave 127.0.0.1)."""
    opened = []

    def _visit(path):
        context = browser.new_context()
        external, errors = [], []

        def gate(route):
            url = route.request.url
            if url.startswith(("data:", "blob:")) or urlparse(url).hostname == "127.0.0.1":
                route.continue_()
            else:
                external.append(url)
                route.abort()

        context.route("**/*", gate)
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{site}/{path}", wait_until="networkidle")
        opened.append(context)
        return page, errors, external

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
