"""The files the package reads at run time, shipped inside it: ``webgpu/`` (the WGSL kernels,
``kernels.json`` and the browser runtime) and ``wasm/`` (the tiny-GPT trainer's C++ source, its
JavaScript side and the committed builds in ``wasm/dist``).

They are package data, found through :mod:`importlib.resources`, so an installed wheel, an
editable checkout and the browser editions under Pyodide all read the same files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def folder(name: str) -> Path:
    """The asset folder ``name`` ("webgpu" or "wasm") as a path on disk.

    A path, not only a resource handle, because node and the build script run on these files;
    pip and Pyodide install a wheel unpacked, so the folder is always on disk."""
    path = Path(str(files(__name__) / name))
    if not path.is_dir():
        raise FileNotFoundError(
            f"posttrainllm's {name!r} assets are missing ({path}): reinstall the package "
            "(pip install --force-reinstall posttrainllm) or, in a clone, `git checkout posttrainllm/assets`"
        )
    return path


def header(name: str) -> str:
    """The opening comment of an asset file (``"wasm/tinygpt.cpp"``): what it is and why, as its
    author wrote it, without the comment markers."""
    folder_name, _, rest = name.partition("/")
    lines = (folder(folder_name) / rest).read_text(encoding="utf-8").splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    end = next((i for i, line in enumerate(lines) if not line.startswith(("//", "#"))), len(lines))
    return "\n".join(line.lstrip("/#").strip() for line in lines[:end])
