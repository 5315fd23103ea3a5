"""The study queue: ``book/study-queue.md``, read, filled and checked without losing a byte.

The file stays hand-editable markdown in the seed's format::

    ## Online softmax
    - What: single-pass softmax that carries a running max and denominator.
    - Why here: TBD
    - Source: https://arxiv.org/abs/1805.02867
    - Taught in: [Module 7 § Online softmax](../notebooks/07-attention.ipynb#online-softmax)

Everything else (the CLI, the notebook study cards, the book page) goes through this module,
so there is one parser and one writer. ``fill`` rewrites only the lines of one topic's
"Why here" field: every other byte of the file is kept as it was.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from posttrainllm import atomic
from posttrainllm.tools import markup
from posttrainllm.tools.checkout import repo_root

UNFILLED = {"", "TBD"}
_FIELD = re.compile(r"^- (?P<name>[^:\n]+?): ?(?P<value>.*?)(?P<eol>\r?\n?)$")
_LINK = re.compile(r"\[(?P<label>[^\]]+)\]\((?P<target>[^)\s]+)\)")
_SLUG_CLEAN = re.compile(r"[^\w\u4e00-\u9fff\- ]")  # the same rule as MyST's heading anchors


class StudyQueueError(ValueError):
    """A request the study queue cannot carry out; the message says why and what to do."""


@dataclass
class Field:
    name: str
    value: str
    start: int  # index of the field's first line in the file's lines
    end: int  # one past its last (continuation) line


@dataclass
class Topic:
    name: str
    line: int
    fields: dict[str, Field] = field(default_factory=dict)

    def get(self, name: str) -> str:
        return self.fields[name].value if name in self.fields else ""

    @property
    def why_here(self) -> str:
        return self.get("Why here")

    @property
    def filled(self) -> bool:
        return self.why_here.strip() not in UNFILLED

    @property
    def taught_in(self) -> list[tuple[str, str]]:
        """``(label, target)`` pairs of the "Taught in" links, e.g. ``("Module 2", "../x.ipynb#a")``."""
        return [(m["label"], m["target"]) for m in _LINK.finditer(self.get("Taught in"))]


def default_path() -> Path:
    """The study queue this checkout's book renders (``POSTTRAINLLM_STUDY_QUEUE`` overrides)."""
    env = os.environ.get("POSTTRAINLLM_STUDY_QUEUE")
    if env:
        return Path(env)
    try:
        return repo_root() / "book" / "study-queue.md"
    except FileNotFoundError:
        raise StudyQueueError(
            "no study queue here: run inside a clone of the book, or name the file "
            "(posttrainllm study --file path/to/study-queue.md …, or POSTTRAINLLM_STUDY_QUEUE)"
        ) from None


def parse(text: str) -> list[Topic]:
    """Topics in file order. A field's value may continue on the lines below it: indented ones, and
    unindented ones too (Markdown's lazy continuation: the book shows them inside the field), up to
    a blank line or a line that starts another block (a field, heading, list item, quote or fence).

    >>> [t.name for t in parse("## A\\n- What: x\\n  more\\n- Why here: TBD\\n")]
    ['A']
    """
    lines = text.splitlines(keepends=True)
    topics: list[Topic] = []
    current: Field | None = None
    for i, line in enumerate(lines):
        if line.startswith("## "):
            topics.append(Topic(name=line[3:].strip(), line=i))
            current = None
            continue
        if not topics:
            continue
        match = _FIELD.match(line)
        if match:
            current = Field(match["name"], match["value"].strip(), i, i + 1)
            topics[-1].fields.setdefault(current.name, current)
        elif current is not None and line.strip() and (line.startswith("  ") or not _BLOCK_START.match(line)):
            current.value = f"{current.value} {line.strip()}".strip()
            current.end = i + 1
        else:
            current = None
    return topics


def load(path: Path | None = None) -> list[Topic]:
    return parse(Path(path or default_path()).read_text(encoding="utf-8"))


def find(topics: list[Topic], name: str) -> Topic:
    """The topic called exactly ``name``; otherwise an error naming the closest topics."""
    for topic in topics:
        if topic.name == name:
            return topic
    names = [t.name for t in topics]
    folded = [t.name for t in topics if t.name.casefold() == name.casefold()]
    close = folded or difflib.get_close_matches(name, names, n=3, cutoff=0.4)
    close += [n for n in names if name.casefold() in n.casefold() and n not in close][:3]
    hint = ("Did you mean: " + ", ".join(f'"{n}"' for n in close) + "?") if close else "No close match."
    raise StudyQueueError(
        f'no study-queue topic is named "{name}". {hint} '
        f"(`posttrainllm study status` lists all {len(names)} topics; names are exact.)"
    )


# A field's value continues on lines that do not start another block (see :func:`parse`).
_BLOCK_START = re.compile(r"^(#{1,6}\s|[-*+]\s|\d+[.)]\s|>|\||```|~~~)")


def _render_why(text: str, eol: str) -> str:
    paragraphs = text.strip().splitlines()
    if not paragraphs:
        raise StudyQueueError('the "Why here" text is empty: write a sentence or two.')
    if any(not p.strip() for p in paragraphs):
        raise StudyQueueError(
            'the "Why here" text has a blank line: keep it to one paragraph '
            "(line breaks are fine, blank lines would end the field)."
        )
    first, *rest = (p.strip() for p in paragraphs)
    return "".join([f"- Why here: {first}{eol}", *(f"  {p}{eol}" for p in rest)])


def filled_text(text: str, name: str, why: str, *, force: bool = False) -> str:
    """``text`` with topic ``name``'s "Why here" set to ``why``; no other byte changes."""
    topics = parse(text)
    topic = find(topics, name)
    if "Why here" not in topic.fields:
        raise StudyQueueError(f'topic "{name}" has no "- Why here:" line to fill; add one first.')
    if topic.filled and not force:
        raise StudyQueueError(
            f'"{name}" already has an answer ("{topic.why_here}"). '
            "Pass --force (force=True) to replace it."
        )
    lines = text.splitlines(keepends=True)
    fld = topic.fields["Why here"]
    eol = _FIELD.match(lines[fld.start])["eol"] or ("\r\n" if "\r\n" in text else "\n")
    new = _render_why(why, eol)
    if fld.end == len(lines) and not lines[-1].endswith("\n"):
        new = new[: -len(eol)]  # the field was the last line, with no newline after it
    filled = "".join(lines[: fld.start]) + new + "".join(lines[fld.end :])
    reason = markup.refusal(filled, fld.start, fld.start + new.count("\n") + (not new.endswith("\n")))
    if reason:
        raise StudyQueueError(f'the "Why here" text was not saved: {reason}. Reword it, or put code in `backticks`.')
    return filled


def markup_problems(text: str) -> list[str]:
    """One line for each filled "Why here" in ``text`` that the book would not show as plain text in
    its field (a hand edit can put anything there; :func:`fill` refuses it before it is written)."""
    problems = []
    for topic in parse(text):
        fld = topic.fields.get("Why here")
        if topic.filled and fld is not None and (reason := markup.refusal(text, fld.start, fld.end)):
            problems.append(f'"{topic.name}": the "Why here" answer cannot go on the page: {reason}')
    return problems


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on a sidecar file, so concurrent fills never lose each other's work."""
    lock_path = path.with_name(f".{path.name}.lock")
    with open(lock_path, "a+b") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # Windows
            import msvcrt

            msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
        yield  # the lock is released when the handle closes


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically, keeping its mode, owner and group."""
    with atomic.replacing(path) as tmp:
        tmp.write_bytes(data)
        before = path.stat()
        os.chmod(tmp, before.st_mode & 0o7777)
        if (before.st_uid, before.st_gid) != (os.stat(tmp).st_uid, os.stat(tmp).st_gid):
            try:
                os.chown(tmp, before.st_uid, before.st_gid)
            except PermissionError:
                raise StudyQueueError(
                    f"{path} belongs to another user or group, which this write could not keep: "
                    "fill it as its owner"
                ) from None


def fill(name: str, why: str, *, force: bool = False, path: Path | None = None) -> Topic:
    """Write topic ``name``'s "Why here" into the study queue file and return the updated topic."""
    path = Path(path or default_path())
    if path.is_file() and not path.stat().st_mode & stat.S_IWUSR:
        raise StudyQueueError(f"{path} is read-only (its mode is {stat.filemode(path.stat().st_mode)}): "
                              "make it writable first if you mean to fill it")
    with _locked(path):
        # newline="" keeps \r\n files as they are; reading inside the lock sees every earlier fill
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
        new = filled_text(text, name, why, force=force)
        _write_atomic(path, new.encode("utf-8"))
    return find(parse(new), name)


# --- checking the teaching anchors ------------------------------------------------------------


def slugify(title: str) -> str:
    """A heading's anchor, as MyST makes it: ``"Learning rate: too hot"`` -> ``"learning-rate-too-hot"``."""
    return _SLUG_CLEAN.sub("", title.lower().replace(" ", "-"))


def _markdown_headings(text: str, max_level: int) -> list[str]:
    titles, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        match = None if fenced else re.match(r"^(#{1,6})\s+(.+?)\s*#*\s*$", line)
        if match and len(match[1]) <= max_level:
            titles.append(match[2])
    return titles


def headings(path: Path, max_level: int = 3) -> list[tuple[str, str]]:
    """``(title, anchor)`` for each heading of a ``.md`` page or an ``.ipynb``'s markdown cells.

    Repeated titles get ``-1``, ``-2`` … like MyST, so anchors stay unique within a page.
    """
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        titles = [
            t
            for c in cells
            if c["cell_type"] == "markdown"
            for t in _markdown_headings("".join(c["source"]), max_level)
        ]
    else:
        titles = _markdown_headings(path.read_text(encoding="utf-8"), max_level)
    seen: dict[str, int] = {}
    out = []
    for title in titles:
        slug = slugify(title)
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}-{seen[slug]}"
        else:
            seen[slug] = 0
        out.append((title, slug))
    return out


# a file of the repository named in a topic's text, e.g. `posttrainllm/assets/webgpu/attention_flash2.wgsl`
_REPO_FILE = re.compile(r"`((?:webgpu|wasm|posttrainllm|notebooks|book|benchmarks|tests)/[\w./-]+\.\w+)`")


def check(path: Path | None = None) -> list[str]:
    """Problems with the queue's teaching anchors and the repository files its topics name; an
    empty list means every topic is anchored and every named file exists."""
    path = Path(path or default_path())
    problems = markup_problems(path.read_text(encoding="utf-8"))
    topics = load(path)
    names = [t.name for t in topics]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f'"{dup}": the topic appears more than once')
    for topic in topics:
        for required in ("What", "Why here", "Source"):
            if required not in topic.fields:
                problems.append(f'"{topic.name}": no "- {required}:" line')
        if not topic.taught_in:
            problems.append(f'"{topic.name}": no teaching anchor (a "- Taught in: [..](..)" link)')
        for named in sorted({m for f in topic.fields.values() for m in _REPO_FILE.findall(f.value)}):
            if not (path.parent.parent / named).is_file():
                problems.append(f'"{topic.name}": names `{named}`, which does not exist')
        for label, target in topic.taught_in:
            file_part, _, anchor = target.partition("#")
            page = (path.parent / file_part).resolve()
            if not page.is_file():
                problems.append(f'"{topic.name}": [{label}] points to {file_part}, which does not exist')
                continue
            anchors = [slug for _, slug in headings(page)]
            if anchor and anchor not in anchors:
                close = difflib.get_close_matches(anchor, anchors, n=1)
                hint = f' (closest: "#{close[0]}")' if close else ""
                problems.append(
                    f'"{topic.name}": [{label}] points to section #{anchor} of {file_part}, '
                    f"which has no such section{hint}"
                )
    return problems


# --- the study card a notebook shows ----------------------------------------------------------


def card(name: str, path: Path | None = None):
    """A notebook widget for one topic: what it is, its gotcha, and a box to write "Why here".

    Save goes through :func:`fill`, the same writer as ``posttrainllm study fill``.
    """
    import html

    import ipywidgets as widgets

    path = Path(path or default_path())
    topic = find(load(path), name)

    def row(label: str, value: str) -> str:
        return f"<p><b>{label}:</b> {html.escape(value)}</p>" if value else ""

    info = widgets.HTML(
        f"<p style='font-size:1.15em'><b>Study card:</b> {html.escape(topic.name)}</p>"
        + row("What", topic.get("What"))
        + row("Gotcha (from code)", topic.get("Gotcha (from code)"))
        + row("Source", topic.get("Source"))
        + "<p><i>Save works when this notebook runs in Jupyter; from a shell, use "
        "<code>posttrainllm study fill</code>.</i></p>"
    )
    box = widgets.Textarea(
        value=topic.why_here if topic.filled else "",
        placeholder="Why here: in your own words, why this project needs this idea…",
        layout=widgets.Layout(width="100%", height="5em"),
    )
    force = widgets.Checkbox(value=False, description="replace my earlier answer", indent=False)
    save = widgets.Button(description="Save", button_style="primary", icon="save")
    status = widgets.HTML()

    def on_save(_button) -> None:
        try:
            fill(topic.name, box.value, force=force.value, path=path)
        except StudyQueueError as err:
            status.value = f"<span style='color:#b00'>Not saved: {html.escape(str(err))}</span>"
        else:
            status.value = f"Saved to {html.escape(str(path))}."

    save.on_click(on_save)
    return _card_class()(topic.name, [info, box, widgets.HBox([save, force]), status])


@functools.cache
def _card_class() -> type:
    import ipywidgets as widgets

    class _StudyCard(widgets.VBox):
        """A VBox whose plain-text form names the topic only, so stored outputs never hold answers."""

        def __init__(self, topic: str, children: list) -> None:
            super().__init__(children)
            self.topic = topic

        def __repr__(self) -> str:
            return f"StudyCard({self.topic!r})"

    return _StudyCard

