"""The wheel as a reader gets it from ``pip install``: built from the files a clone has, installed
into a fresh virtual environment (:func:`tests.conftest.fresh_venv`: the package itself comes only
from the wheel), and used from a folder with no checkout around it."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from posttrainllm import webgpu
from tests.conftest import ROOT, clean_env, fresh_venv, require


def _clone_files(dest: Path) -> Path:
    """Copy what a fresh clone holds: tracked files and new files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(python, workdir)``: a venv holding only the wheel, and an empty folder to run in."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = _clone_files(tmp / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(source)], check=True, capture_output=True)
    [wheel] = (tmp / "dist").glob("posttrainllm-*.whl")
    python = fresh_venv(tmp / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True)
    work = tmp / "elsewhere"
    work.mkdir()
    return python, work


def _run(installed, *args):
    """Run ``args`` in the empty folder, with nothing pointing back at the checkout."""
    return subprocess.run([str(a) for a in args], cwd=installed[1], env=clean_env(), capture_output=True, text=True,
                          timeout=600)


def _script(installed, code: str) -> str:
    result = _run(installed, installed[0], "-c", textwrap.dedent(code))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_every_module_imports_from_the_wheel_not_the_checkout(installed):
    out = _script(installed, """
        import importlib, json, pkgutil, posttrainllm
        names = [m.name for m in pkgutil.walk_packages(posttrainllm.__path__, "posttrainllm.")
                 if m.name != "posttrainllm.__main__"]
        for name in names:
            importlib.import_module(name)
        print(json.dumps({"file": posttrainllm.__file__, "modules": names}))
    """)
    found = json.loads(out)
    assert Path(found["file"]).is_relative_to(installed[0].parents[1]), found["file"]
    assert {"posttrainllm.model", "posttrainllm.webgpu", "posttrainllm.wasm", "posttrainllm.assets"} <= set(
        found["modules"])


def test_the_kernels_and_their_browser_cells_ship_in_the_wheel(installed):
    out = _script(installed, """
        import json
        from posttrainllm import webgpu
        print(json.dumps({kind: webgpu.browser_cell(kind).data for kind in ("matmul", "attention")}))
    """)
    # the cells inline runtime.js, cells.js, kernels.json's variants and every kernel's source
    assert json.loads(out) == {kind: webgpu.browser_cell(kind).data for kind in ("matmul", "attention")}


def test_the_trainer_runs_from_the_wheel_with_its_shipped_config(installed):
    result = _run(installed, installed[0], "-m", "posttrainllm.pretrain", "--config", "tiny", "steps=2",
                  "save_every=0", "out=run", "progress=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((installed[1] / "run" / "log.jsonl").read_text().splitlines()) == 2
    assert (installed[1] / "run" / "step-000002" / "state.pt").is_file()


def test_a_kernel_runs_on_lavapipe_from_the_wheel(installed):
    require(os.path.isfile(webgpu.DRIVERS["lavapipe"]), "the lavapipe Vulkan driver")
    pytest.importorskip("wgpu")
    out = _script(installed, """
        import numpy as np
        from posttrainllm import webgpu
        webgpu.use_driver("lavapipe")
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((37, 21), dtype=np.float32), rng.standard_normal((21, 45), dtype=np.float32)
        c, _ = webgpu.GPU().matmul(a, b, file="matmul_tiled.wgsl")
        print(float(np.abs(c - a.astype(np.float64) @ b).max()))
    """)
    assert float(out) < 1e-4


def test_the_wasm_trainer_runs_under_node_from_the_wheel(installed):
    require(shutil.which("node") is not None, "node")
    out = _script(installed, """
        import json
        import numpy as np
        from posttrainllm import wasm
        config = {"vocab": 64, "block": 16, "layers": 1, "heads": 2, "embd": 16, "batch": 2}
        tokens = np.random.default_rng(0).integers(0, 64, 400)
        answer = wasm.run("simd", config, tokens=tokens, steps=3, seed=1)
        print(json.dumps(answer["losses"]))
    """)
    losses = json.loads(out)
    assert len(losses) == 3 and all(3.0 < x < 5.0 for x in losses), losses  # ln 64 = 4.16 at the start


def test_study_and_coverage_outside_a_clone(installed, queue_copy, tmp_path):
    """The wheel's copy of the queue serves the study cards and `study`; `coverage` needs a clone."""
    cli = installed[0].parent / "posttrainllm"
    env = clean_env(POSTTRAINLLM_STUDY_ANSWERS=str(tmp_path / "answers.json"))
    run = {"cwd": installed[1], "env": env, "capture_output": True, "text": True, "timeout": 600}
    cover = subprocess.run([cli, "coverage"], **run)
    assert cover.returncode == 2 and cover.stderr.startswith("error: ") and "--root" in cover.stderr, cover
    assert "Traceback" not in cover.stderr
    fill = subprocess.run([cli, "study", "fill", "Online softmax", "from a pip install"], **run)
    assert fill.returncode == 0 and str(tmp_path / "answers.json") in fill.stdout, fill.stderr
    status = subprocess.run([cli, "study", "status"], **run)
    assert status.returncode == 0 and "1 of 19 topics have a 'Why here'" in status.stdout, status.stderr
    card = subprocess.run([installed[0], "-c", "from posttrainllm.tools import study\n"
                           "print(study.card('Online softmax').children[1].value)"], **run)
    assert card.returncode == 0 and card.stdout == "from a pip install\n", card.stderr
    named = subprocess.run([cli, "study", "--file", queue_copy, "status"], **run)
    assert named.returncode == 0 and "0 of 19 topics" in named.stdout, named.stderr
    cover = subprocess.run([cli, "coverage", "--root", ROOT], **run)
    assert cover.returncode == 0 and "posttrainllm/assets/webgpu/matmul_tiled.wgsl" in cover.stdout, cover.stderr
