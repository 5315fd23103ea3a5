"""The browser cells in JupyterLab: a real server on 127.0.0.1, headless Chromium with WebGPU on
(SwiftShader), the module's notebook opened and run, the WebGPU race run and checked, and in
module 7 the WASM trainer trained against the oracle's losses.

A notebook opened from disk is untrusted, so the stored outputs' scripts must stay off until
the reader runs the cells; after Run All the cell starts and its results match the CPU."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.book.test_browser import WEBGPU_FLAGS, train_wasm_cell, wasm_cell
from tests.conftest import ROOT, chromium_path, require

NOTEBOOKS = {"03-tensors.ipynb": "matmul", "07-attention.ipynb": "attention"}
TOKEN = "posttrainllm-test"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free 127.0.0.1 port, serving copies of the notebooks, with every
    Jupyter config, runtime and settings directory private to the test."""
    pytest.importorskip("jupyterlab")
    home = tmp_path_factory.mktemp("lab")
    for name in NOTEBOOKS:
        shutil.copy(ROOT / "notebooks" / name, home / name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **{var: str(home / f".{var.lower()}") for var in (
        "JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTERLAB_SETTINGS_DIR")}}
    command = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
               f"--ServerApp.root_dir={home}", "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root; JupyterLab refuses without this
    log = open(home / "lab.log", "w")  # noqa: SIM115 - closed below, after the server stops
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api?token={TOKEN}", timeout=2)
                break
            except OSError:
                assert server.poll() is None, (home / "lab.log").read_text()
                time.sleep(0.5)
        yield base
    finally:
        server.terminate()  # only the server this fixture started, by its handle
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def chromium(playwright):
    path = chromium_path()
    require(path is not None, "Debian's chromium (apt-get install chromium)")
    browser = playwright.chromium.launch(executable_path=path, args=WEBGPU_FLAGS)
    yield browser
    browser.close()


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS))
def test_the_browser_cells_run_in_jupyterlab(lab, chromium, notebook, wasm_oracle):
    context = chromium.new_context()
    try:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{lab}/lab/tree/{notebook}?reset&token={TOKEN}")  # reset: no tabs restored from the last test
        page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')", timeout=60000)
        page.wait_for_timeout(2000)  # the stored outputs are rendered by now
        assert page.evaluate("document.querySelector('.ptl-webgpu')?.dataset.state ?? null") is None  # untrusted: off
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function("document.querySelector('.ptl-webgpu')?.dataset.state === 'ready'", timeout=180000)
        cell = page.locator(".ptl-webgpu")
        cell.locator("select").select_option("small")
        cell.locator("button.ptl-run").click()
        page.wait_for_function("e => ['done', 'error'].includes(e.dataset.state)", arg=cell.element_handle(),
                               timeout=240000)
        status = cell.locator(".ptl-status").inner_text()
        assert cell.get_attribute("data-state") == "done", status
        timed = [r for r in json.loads(cell.get_attribute("data-results")) if "skipped" not in r]
        assert timed and all(r["ok"] for r in timed)
        assert "Every result matched the CPU" in status
        if notebook == "07-attention.ipynb":  # and the WASM trainer: JupyterLab is not isolated, so one thread
            note = wasm_cell(page).locator(".ptl-threads-note").text_content()
            assert "Cross-Origin-Embedder-Policy" in note and page.locator(".ptl-isolate").count() == 0
            run, _ = train_wasm_cell(page, wasm_oracle)
            assert run["build"] == "relaxed" and run["threads"] == 1
        assert errors == []
    finally:
        context.close()
