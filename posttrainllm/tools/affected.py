"""Which unit tests and notebooks a change can affect: what ``make check`` runs.

A test file or a notebook depends on itself, on the package modules it uses and on every module
those use in turn (read from the source, so an import inside a function counts too). A change to
any of them selects it. The rest is conservative, since a check that misses a broken test costs
more than one that runs a few extra:

- a package asset (``posttrainllm/assets/<name>/...``) counts as a change to every module whose
  source names ``<name>`` (``webgpu.py`` reads ``assets/webgpu``, ``tools/models.py`` reads
  ``model_times.json``);
- any other file (a book page, a benchmark, a test helper) selects the test files whose source
  names its folder or its name (``test_notebook_files.py`` names ``notebooks``);
- a change to what every test runs under (:data:`EVERYTHING`) selects everything.

"Changed" means changed since the branch left ``base`` (``main``), committed or not, untracked
files included.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import subprocess
from pathlib import Path

from posttrainllm.tools.checkout import repo_root
from posttrainllm.tools.coverage import _cells, modules_used

# the set-up every test and notebook runs under
EVERYTHING = {"pyproject.toml", "setup.py", "constraints.txt", "MANIFEST.in", "Makefile", "conftest.py",
              "tests/conftest.py", "tests/__init__.py", "notebooks/sanitize.cfg", "posttrainllm/__init__.py"}


# modules that import most others only inside the functions that need them: a notebook depends on
# the functions of theirs it calls, not on the whole module
HUBS = {"tools.mastery"}


def changed_files(root: Path, base: str = "main") -> set[str]:
    """Files changed since the branch left ``base``, committed, staged or not, and untracked ones."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout

    try:
        fork = git("merge-base", base, "HEAD").strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"no branch or commit named {base!r} to compare with: pass --base <branch>") from None
    diff = git("diff", "--name-only", "--no-renames", fork)  # the merge-base against the working tree
    untracked = git("ls-files", "--others", "--exclude-standard")
    return set(diff.split()) | set(untracked.split())


def module_name(path: str) -> str | None:
    """``"posttrainllm/tools/study.py"`` -> ``"tools.study"``; None for a file that is not a module."""
    if not (path.startswith("posttrainllm/") and path.endswith(".py")):
        return None
    name = path.removeprefix("posttrainllm/").removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _sources(root: Path) -> dict[str, str]:
    return {module_name(p.relative_to(root).as_posix()): p.read_text(encoding="utf-8")
            for p in (root / "posttrainllm").rglob("*.py")}


def _imported(code: str) -> set[str]:
    """What ``code``'s statements import from the package, as :func:`modules_used` names it; a
    docstring or comment that mentions ``posttrainllm.x`` is not a use. Code that does not parse
    (a cell magic) is read as text."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return modules_used(code)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "posttrainllm":
            names.add(f"posttrainllm.{node.attr}")
    return {n.removeprefix("posttrainllm.") for n in names if n.startswith("posttrainllm.")}


def _uses(code: str, modules: set[str]) -> set[str]:
    """The package modules ``code`` uses; ``from posttrainllm.tools.x import y`` names ``tools.x``."""
    used = set()
    for name in _imported(code):
        while name and name not in modules:  # posttrainllm.tools.x.y (an attribute) -> tools.x
            name = name.rpartition(".")[0]
        if name:
            used.add(name)
    return used


def _hub_uses(hub: str, code: str, modules: set[str]) -> set[str]:
    """What ``code`` needs of ``hub``: its module-level imports, and the modules that the functions
    ``code`` names (and the functions those call) import inside them. Each mastery gate imports the
    module it checks, so module 1's gate does not tie module 1 to attention."""
    top, defs = _definitions(hub)
    names = re.compile(r"\b(" + "|".join(map(re.escape, defs)) + r")\b")
    wanted, todo = set(), set(names.findall(code))
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo |= set(names.findall(defs[name])) - wanted
    return _uses(top + "\n" + "\n".join(defs[n] for n in wanted), modules)


@functools.cache
def _definitions(source: str) -> tuple[str, dict[str, str]]:
    """A module's code outside its functions and classes, and each one's source with its decorators."""
    lines = source.splitlines()

    def text(node: ast.stmt) -> str:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "\n".join(lines[start - 1 : node.end_lineno])

    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    body = ast.parse(source).body
    return ("\n".join(text(n) for n in body if not isinstance(n, kinds)),
            {n.name: text(n) for n in body if isinstance(n, kinds)})


def closure(code: str, sources: dict[str, str]) -> set[str]:
    """Every package module ``code`` depends on: the ones it uses, and theirs, transitively."""
    modules = set(sources)
    seen: set[str] = set()
    todo = {(name, code) for name in _uses(code, modules)}
    while todo:
        name, user = todo.pop()
        if name not in seen:
            seen.add(name)
            uses = _hub_uses(sources[name], user, modules) if name in HUBS else _uses(sources[name], modules)
            todo |= {(used, sources[name]) for used in uses - seen}
    return seen


def _code(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(source for kind, source in _cells(path) if kind == "code")
    return path.read_text(encoding="utf-8")


def selected(root: Path, candidates: list[Path], changed: set[str]) -> list[Path]:
    """The ``candidates`` (test files, notebooks) that ``changed`` can affect, in their order."""
    if changed & EVERYTHING:
        return list(candidates)
    sources = _sources(root)
    touched = {module_name(f) for f in changed} - {None}
    others = set()
    for f in changed:
        if f.startswith("posttrainllm/assets/"):
            name = f.removeprefix("posttrainllm/assets/").split("/")[0]
            touched |= {m for m, src in sources.items() if name in src}
        elif module_name(f) is None and not f.startswith("tests/unit/test_"):
            top = f.split("/")[0]  # a test helper is named by its module; another file by its folder too
            others |= {Path(f).stem} if top == "tests" else {top, Path(f).stem}
    picked = []
    for path in candidates:
        rel = path.relative_to(root).as_posix()
        code = _code(path)
        if (rel in changed or closure(code, sources) & touched
                or (path.suffix == ".py" and any(re.search(rf"\b{re.escape(n)}\b", code) for n in others))):
            picked.append(path)
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrainllm.tools.affected", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("tests", "notebooks"), help="unit test files, or module notebooks")
    parser.add_argument("--base", default="main", help="the branch to compare with (default: main)")
    args = parser.parse_args(argv)
    root = repo_root()
    pattern = "tests/unit/test_*.py" if args.kind == "tests" else "notebooks/[0-9][0-9]-*.ipynb"
    for path in selected(root, sorted(root.glob(pattern)), changed_files(root, args.base)):
        print(path.relative_to(root).as_posix())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
