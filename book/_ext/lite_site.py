"""The JupyterLite site, built into the book at ``_build/html/lite`` after Sphinx has finished.

What the site serves itself, so the Pyodide kernel starts with no network:

- Pyodide (the npm package ``pyodide``, pinned in package.json) with its lock file rewritten:
  the pure-Python wheels the kernel needs to start (micropip, IPython, jedi and what they need)
  and the wheels below point at copies in the site; every other package (numpy, matplotlib, ...)
  points at the Pyodide CDN, which is where its Pyodide build is published.
- ``posttrainllm`` as a wheel built from this checkout, and ipywidgets with what it needs, at
  the versions installed here (so the page's widget manager and the kernel's widgets agree).
  Both are lock entries, so ``import posttrainllm`` loads the wheel with no ``%pip`` step.
- The browser editions of the notebooks (:func:`posttrainllm.tools.lite.edition`) and the study
  queue, in the in-browser file system, where ``study.card`` finds and saves it.

``python book/_ext/lite_site.py wheels`` downloads the pure-Python wheels (``make vendor``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat

from posttrainllm.tools import lite

ROOT = Path(__file__).resolve().parents[2]
PYODIDE = ROOT / "node_modules" / "pyodide"
WHEELS = ROOT / "_build" / "lite-wheels"
STAGE = ROOT / "_build" / "lite"
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")
# what the Pyodide kernel installs as it starts (lock names), with their dependencies
KERNEL_START = ("micropip", "ipython", "jedi")
# not in Pyodide's lock: taken at the versions installed in this environment
INSTALLED = ("comm", "ipywidgets", "jupyterlab-widgets", "markdown-it-py", "mdurl", "mdit-py-plugins", "linkify-it-py")
DEPENDS = {
    # markdown-it and its plugins: the study queue judges answers with the book's Markdown parser
    "posttrainllm": ["ipywidgets", "pygments", "markdown-it-py", "mdit-py-plugins", "linkify-it-py"],
    "ipywidgets": ["comm", "ipython", "traitlets", "jupyterlab-widgets", "widgetsnbextension"],
    "comm": ["traitlets"],
    "markdown-it-py": ["mdurl"],
    "mdit-py-plugins": ["markdown-it-py"],
}
SHIMS = Path(sys.prefix) / "share/jupyter/labextensions/@jupyterlite/pyodide-kernel-extension/static/pypi"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyodide() -> tuple[dict, str]:
    if not (PYODIDE / "pyodide-lock.json").is_file():
        raise FileNotFoundError(f"no Pyodide in {PYODIDE}: run `make vendor` (npm ci) first")
    version = json.loads((PYODIDE / "package.json").read_text())["version"]
    return json.loads((PYODIDE / "pyodide-lock.json").read_text()), version


def wheel_specs() -> list[str]:
    """``name==version`` of every pure-Python wheel the site serves from PyPI."""
    packages = {_norm(k): v for k, v in _pyodide()[0]["packages"].items()}
    todo, seen = [*KERNEL_START, "pygments", "traitlets"], {}
    while todo:
        name = _norm(todo.pop())
        if name not in seen:
            seen[name] = packages[name]
            todo.extend(packages[name]["depends"])
    specs = [f"{p['name']}=={p['version']}" for p in seen.values()]
    return sorted(specs + [f"{n}=={metadata.version(n)}" for n in INSTALLED])


def download_wheels() -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*pip, "--python-version", "3.14", "--dest", str(WHEELS), *wheel_specs()], check=True)


def downloaded_wheels() -> list[Path]:
    """The wheel of each of :func:`wheel_specs` in WHEELS; a missing one is an error."""
    have = {(_norm(w.name.split("-")[0]), w.name.split("-")[1]): w for w in WHEELS.glob("*.whl")}
    wanted = [(_norm(name), version) for name, version in (s.split("==") for s in wheel_specs())]
    missing = [f"{n}=={v}" for n, v in wanted if (n, v) not in have]
    if missing:
        raise FileNotFoundError(f"wheels missing from {WHEELS}: {', '.join(missing)}; run `make vendor`")
    return [have[key] for key in wanted]


def _wheel_entry(path: Path, depends: list[str]) -> dict:
    name, version = path.name.split("-")[:2]
    tops = {n.split("/")[0] for n in zipfile.ZipFile(path).namelist()}
    imports = sorted(t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data")))
    return {
        "name": name, "version": version, "file_name": path.name, "install_dir": "site",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "package_type": "package",
        "imports": imports, "depends": depends, "unvendored_tests": False,
    }


def stage_pyodide(wheels: list[Path], dest: Path) -> None:
    """Pyodide and our wheels in ``dest``, with the lock file rewritten as the docstring says."""
    lock, version = _pyodide()
    dest.mkdir(parents=True)
    for name in PYODIDE_FILES:
        shutil.copy2(PYODIDE / name, dest / name)
    cdn = lite.CDN.format(version=version)
    packages = lock["packages"]
    for entry in packages.values():
        entry["file_name"] = cdn + entry["file_name"]
    for wheel in wheels:
        shutil.copy2(wheel, dest / wheel.name)
        key = _norm(wheel.name.split("-")[0])
        entry = _wheel_entry(wheel, DEPENDS.get(key, packages.get(key, {}).get("depends", [])))
        packages[key] = {**packages.get(key, {}), **entry}
    (dest / "pyodide-lock.json").write_text(json.dumps(lock), encoding="utf-8")


def _package_wheel(dest: Path) -> Path:
    """posttrainllm's wheel, built from a copy of the checkout (setuptools writes build/ and
    *.egg-info next to the sources it builds)."""
    src = dest / "src"
    shutil.copytree(ROOT / "posttrainllm", src / "posttrainllm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "-w", str(dest), str(src)], check=True)
    (wheel,) = dest.glob("posttrainllm-*.whl")
    return wheel


def stage_contents(dest: Path) -> None:
    (dest / "notebooks").mkdir(parents=True)
    (dest / "book").mkdir()
    for stem in lite.IN_BROWSER:
        nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
        nbformat.write(nbformat.from_dict(lite.edition(nb)), dest / "notebooks" / f"{stem}.ipynb")
    shutil.copy2(ROOT / "book" / "study-queue.md", dest / "book" / "study-queue.md")


def build(outdir: Path) -> None:
    """Stage everything in _build/lite and let ``jupyter lite build`` write ``outdir``."""
    wheels = downloaded_wheels()
    shutil.rmtree(STAGE, ignore_errors=True)
    shutil.rmtree(outdir, ignore_errors=True)
    STAGE.mkdir(parents=True)
    wheels += [_package_wheel(STAGE / "dist"), *SHIMS.glob("widgetsnbextension-4*.whl")]
    stage_pyodide(wheels, STAGE / "site" / "static" / "pyodide")
    stage_contents(STAGE / "contents")
    config = {"jupyter-lite-schema-version": 0, "jupyter-config-data": {"exposeAppInBrowser": True}}
    (STAGE / "site" / "jupyter-lite.json").write_text(json.dumps(config), encoding="utf-8")
    apps = [arg for app in ("lab", "notebooks", "repl") for arg in ("--apps", app)]
    done = subprocess.run(
        [Path(sys.executable).with_name("jupyter-lite"), "build", "--contents", str(STAGE / "contents"),
         "--output-dir", str(outdir), "--no-sourcemaps", "--no-unused-shared-packages", *apps],
        cwd=STAGE / "site", capture_output=True, text=True,
    )
    if done.returncode:
        raise RuntimeError(f"jupyter lite build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


def on_build_finished(app, exception) -> None:
    if exception is None and app.builder.name == "html" and app.config.posttrainllm_lite_site:
        build(Path(app.outdir) / "lite")


if __name__ == "__main__":
    if sys.argv[1:] != ["wheels"]:
        sys.exit("usage: python book/_ext/lite_site.py wheels")
    download_wheels()
