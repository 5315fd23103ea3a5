"""The coverage map: which notebook section teaches each package module and each kernel file.

It is computed from the notebooks and the book pages that run code as MyST notebooks (the
imports and file names their code cells use, under the heading they sit in), so the book's
coverage page cannot go stale.
"""

from __future__ import annotations

import json
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import posttrainllm
from posttrainllm.tools.checkout import repo_root
from posttrainllm.tools.study import headings, slugify

# Modules that run the book rather than teach a concept (and all of posttrainllm.tools); the map
# lists them apart.
TOOLING = {"__main__", "assets", "atomic", "progress"}
ASSET_DIRS = ("posttrainllm/assets",)
ASSET_SUFFIXES = {".wgsl", ".js", ".mjs", ".c", ".cc", ".cpp", ".h", ".hpp"}


@dataclass(frozen=True)
class Section:
    notebook: str  # path relative to the checkout, e.g. "notebooks/01-from-a-line.ipynb"
    title: str
    anchor: str  # "" for code above the notebook's first section: the page itself


def book_root(root: Path | None = None) -> Path:
    """The clone of the book whose notebooks the map reads: ``root``, or the one around us."""
    if root is None:
        try:
            return repo_root()
        except FileNotFoundError:
            raise FileNotFoundError(
                "the coverage map reads a book's notebooks: run it inside a clone of the book, "
                "or name one (posttrainllm coverage --root path/to/clone)"
            ) from None
    root = Path(root)
    if not (root / "notebooks").is_dir():
        raise FileNotFoundError(f"{root} has no notebooks/ folder: give the top folder of a clone of the book")
    return root


def package_modules() -> list[str]:
    """Every module of the package, by its name under it (``"linear"``, ``"tools.study"``, …)."""
    found = pkgutil.walk_packages(posttrainllm.__path__, "posttrainllm.")
    return sorted(m.name.removeprefix("posttrainllm.") for m in found if m.name != "posttrainllm.tools")


def is_tooling(name: str) -> bool:
    """Whether ``name`` (as :func:`package_modules` gives it) runs the book rather than teaching; the
    book's answers (``solutions.*``) count as such: the exercise they answer is what teaches."""
    return name in TOOLING or name.startswith(("tools.", "solutions"))


def asset_files(root: Path) -> list[str]:
    """WGSL kernels, their JS runtime and the WASM trainer's sources, relative to ``root``."""
    found = (p.relative_to(root) for d in ASSET_DIRS if (root / d).is_dir() for p in (root / d).rglob("*"))
    skip = {"build", "dist", "node_modules"}  # built output, not source
    return sorted(p.as_posix() for p in found if p.suffix in ASSET_SUFFIXES and not skip & set(p.parts))


def modules_used(code: str) -> set[str]:
    """Package modules a code cell uses.

    >>> sorted(modules_used("from posttrainllm import linear, nn as n\\nfrom posttrainllm.tools import study\\n"
    ...                     "posttrainllm.tools.mastery.x"))
    ['linear', 'nn', 'tools.mastery', 'tools.study']
    """
    used = {name for name in re.findall(r"\bposttrainllm\.((?:tools\.)?\w+)", code) if name != "tools"}
    pattern = r"from\s+posttrainllm(\.tools)?\s+import\s+(?:\(([^)]*)\)|([^\n]+))"
    for tools, bracketed, line in re.findall(pattern, code):
        names = (bracketed or line).split("#")[0]
        prefix = "tools." if tools else ""
        used.update(prefix + n.split()[0] for n in names.replace("\n", " ").split(",") if n.strip())
    return used


def _cells(path: Path):
    """``(kind, source)`` for each cell of an ``.ipynb``, or of a MyST text notebook (a ``.md`` page
    whose ``{code-cell}`` blocks the book executes); the text between code cells is markdown."""
    if path.suffix == ".ipynb":
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            yield cell["cell_type"], "".join(cell["source"])
        return
    for i, part in enumerate(re.split(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", path.read_text(encoding="utf-8"),
                                      flags=re.M | re.S)):
        yield ("code" if i % 2 else "markdown"), part


def _cells_by_section(path: Path):
    """Yield ``(section title, anchor, code)`` for each code cell, tracking the heading it falls under."""
    slugs = {title: slug for title, slug in headings(path)}
    title = anchor = ""
    for kind, source in _cells(path):
        if kind == "markdown":
            for line in source.splitlines():
                match = re.match(r"^(#{1,3})\s+(.+?)\s*$", line)
                if match:
                    title = match[2]
                    anchor = "" if match[1] == "#" else slugs.get(title, slugify(title))
        elif kind == "code":
            yield title, anchor, source


def teaching_pages(root: Path) -> list[Path]:
    """The notebooks, then the book pages that are executable MyST notebooks."""
    pages = sorted((root / "notebooks").glob("*.ipynb"))
    return pages + [p for p in sorted((root / "book").glob("*.md")) if "\nfile_format: mystnb" in p.read_text("utf-8")]


def coverage_map(root: Path | None = None) -> dict[str, list[Section]]:
    """``{"posttrainllm.linear": [Section, …], "posttrainllm/assets/webgpu/matmul_tiled.wgsl": […], …}``,
    in a stable order."""
    root = book_root(root)
    items = {f"posttrainllm.{m}": [] for m in package_modules()}
    assets = asset_files(root)
    items.update({a: [] for a in assets})
    for nb in teaching_pages(root):
        rel = nb.relative_to(root).as_posix()
        for title, anchor, code in _cells_by_section(nb):
            found = {f"posttrainllm.{m}" for m in modules_used(code)}
            found |= {a for a in assets if Path(a).name in code}
            for item in sorted(found & items.keys()):
                section = Section(rel, title, anchor)
                if section not in items[item]:
                    items[item].append(section)
    return items


def untaught(root: Path | None = None) -> list[str]:
    """Package modules and kernel files that no notebook section uses (tooling excepted)."""
    return [
        item
        for item, sections in coverage_map(root).items()
        if not sections and not is_tooling(item.removeprefix("posttrainllm."))
    ]


def markdown_table(root: Path | None = None, link_prefix: str = "../") -> str:
    """The map as a MyST table; links are relative to a page one folder below the root."""
    rows = ["| Code | Taught in |", "| --- | --- |"]
    tooling = []
    for item, sections in coverage_map(root).items():
        if is_tooling(item.removeprefix("posttrainllm.")):
            tooling.append(f"`{item}`")
            continue
        where = ", ".join(
            f"[{Path(s.notebook).stem} · {s.title}]({link_prefix}{s.notebook}{'#' + s.anchor if s.anchor else ''})"
            for s in sections
        )
        rows.append(f"| `{item}` | {where or '**not taught yet**'} |")
    rows.append("")
    rows.append("Tooling that runs the book rather than teaching a concept: " + ", ".join(tooling) + ".")
    return "\n".join(rows) + "\n"


def gate_map(root: Path | None = None) -> dict[str, list[Section]]:
    """``{"check_fit_line": [Section, …], …}``: where the notebooks call each mastery gate."""
    from posttrainllm.tools import mastery

    root = book_root(root)
    found: dict[str, list[Section]] = {}
    for nb in teaching_pages(root):
        for title, anchor, code in _cells_by_section(nb):
            for gate in re.findall(r"\bmastery\.(check_\w+)\(", code):
                section = Section(nb.relative_to(root).as_posix(), title, anchor)
                if section not in found.setdefault(gate, []):
                    found[gate].append(section)
    return {gate: found.get(gate, []) for gate in [*mastery.GATES, *sorted(set(found) - set(mastery.GATES))]}


def mastery_table(root: Path | None = None, link_prefix: str = "../") -> str:
    """Every gate of :data:`posttrainllm.tools.mastery.GATES` with its kind, task and the notebook
    section that runs it, as a MyST table (links relative to a page one folder below the root)."""
    from posttrainllm.tools import mastery

    rows = ["| Module | Gate | Kind | Task | Where |", "| ---: | --- | --- | --- | --- |"]
    for gate, sections in gate_map(root).items():
        module, kind = mastery.GATES.get(gate, ("?", "**not registered**"))
        where = ", ".join(f"[{s.title}]({link_prefix}{s.notebook}{'#' + s.anchor if s.anchor else ''})"
                          for s in sections)
        task = mastery.describe(gate).replace("|", "\\|")
        rows.append(f"| {module} | `{gate}` | {kind} | {task} | {where or '**not run by any notebook**'} |")
    counts = [sum(m == module for m, _ in mastery.GATES.values()) for module in range(1, 11)]
    return "\n".join(rows) + f"\n\n{len(mastery.GATES)} gates; per module: {', '.join(map(str, counts))}.\n"
