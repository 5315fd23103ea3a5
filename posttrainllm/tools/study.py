"""The study queue: its topics, the reader's answers, and the one parser and writer for both.

The topics are ``book/study-queue.md``, hand-editable Markdown in the seed's format::

    ## Online softmax
    - What: single-pass softmax that carries a running max and denominator.
    - Why here: TBD
    - Source: https://arxiv.org/abs/1805.02867
    - Taught in: [Module 7 § Online softmax](../notebooks/07-attention.ipynb#online-softmax)

A reader's answers are kept apart from it, in their own answers file (:mod:`posttrainllm.tools.answers`),
and shown in place of "TBD" wherever the queue is shown: ``posttrainllm study status``, the
notebooks' study cards, the reader's own build of the book. A reader who wants them in a Markdown
queue instead (their fork's ``book/study-queue.md``) names it (``--file``, ``path=``,
``POSTTRAINLLM_STUDY_QUEUE``), and ``fill`` then rewrites only the lines of one topic's "Why here"
field in that file: every other byte is kept as it was. :func:`text` (``study export``) and
:func:`import_answers` move answers between the two.

Outside a clone of the book (a pip install, Colab), the topics come from the copy of the queue
that the package's wheel carries.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from posttrainllm import atomic
from posttrainllm.tools import answers, markup
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


def named_queue() -> Path | None:
    """The Markdown queue the reader asked to keep answers in (``POSTTRAINLLM_STUDY_QUEUE``), if any."""
    env = os.environ.get("POSTTRAINLLM_STUDY_QUEUE")
    return Path(env) if env else None


def queue_path() -> Path:
    """The queue's topics: this clone's ``book/study-queue.md``, else the copy a wheel carries."""
    try:
        return repo_root() / "book" / "study-queue.md"
    except FileNotFoundError:
        packaged = Path(str(resources.files("posttrainllm.assets").joinpath("study-queue.md")))
        if packaged.is_file():
            return packaged
        raise StudyQueueError(
            "no study queue here: run inside a clone of the book, or name the file "
            "(posttrainllm study --file path/to/study-queue.md …, or POSTTRAINLLM_STUDY_QUEUE)"
        ) from None


def where(path: Path | None = None) -> str:
    """Where answers go: the named Markdown queue, or the reader's answers file."""
    named = path or named_queue()
    return str(named) if named else str(answers.path())


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
    """The topics, with the reader's answers: those of the Markdown queue ``path`` (or
    ``POSTTRAINLLM_STUDY_QUEUE``); by default, the book's queue with the answers file's answers."""
    return parse(text(path))


def text(path: Path | None = None) -> str:
    """The queue as Markdown with the reader's answers in it (see :func:`load`)."""
    named = path or named_queue()
    if named:
        return _read(Path(named))
    return with_answers(_read(queue_path()), answers.load())


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as handle:  # newline="" keeps \r\n files as they are
        return handle.read()


def with_answers(queue: str, answered: dict[str, str]) -> str:
    """``queue`` with each answer of ``answered`` in its topic's "Why here" (answers for topics the
    queue does not have are left out: :func:`orphans` names them)."""
    names = {t.name for t in parse(queue)}
    for name, why in answered.items():
        if name in names and why.strip() not in UNFILLED:
            queue = filled_text(queue, name, why, force=True)
    return queue


def orphans() -> list[str]:
    """Topics in the reader's answers file that the queue no longer has (renamed or removed)."""
    names = {t.name for t in parse(_read(queue_path()))}
    return sorted(set(answers.load()) - names)


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


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically, keeping its owner and group (``atomic`` keeps its mode)."""
    with atomic.replacing(path) as tmp:
        tmp.write_bytes(data)
        before = path.stat()
        if (before.st_uid, before.st_gid) != (os.stat(tmp).st_uid, os.stat(tmp).st_gid):
            try:
                os.chown(tmp, before.st_uid, before.st_gid)
            except PermissionError:
                raise StudyQueueError(
                    f"{path} belongs to another user or group, which this write could not keep: "
                    "fill it as its owner"
                ) from None


def fill(name: str, why: str, *, force: bool = False, path: Path | None = None) -> Topic:
    """Save topic ``name``'s "Why here" in the reader's answers file, or in the Markdown queue
    ``path`` (or ``POSTTRAINLLM_STUDY_QUEUE``); return the updated topic."""
    named = path or named_queue()
    if named:
        return _fill_file(Path(named), name, why, force)
    queue = _read(queue_path())
    with answers.updating() as answered:
        new = filled_text(with_answers(queue, answered), name, why, force=force)  # checks name, force, markup
        topic = find(parse(new), name)
        answered[topic.name] = why.strip()
    return topic


def _fill_file(path: Path, name: str, why: str, force: bool) -> Topic:
    if path.is_file() and not path.stat().st_mode & stat.S_IWUSR:
        raise StudyQueueError(f"{path} is read-only (its mode is {stat.filemode(path.stat().st_mode)}): "
                              "make it writable first if you mean to fill it")
    with atomic.locked(path):
        new = filled_text(_read(path), name, why, force=force)  # read inside the lock: sees every earlier fill
        _write_atomic(path, new.encode("utf-8"))
    return find(parse(new), name)


def import_answers(source: Path, *, force: bool = False) -> list[str]:
    """Copy the answers filled in the Markdown queue ``source`` into the reader's answers file;
    return the topics copied. A different answer already saved is kept unless ``force``."""
    given = _answers_in(_read(Path(source)))
    queue = _read(queue_path())
    unknown = sorted(set(given) - {t.name for t in parse(queue)})
    if unknown:
        raise StudyQueueError(f"{source} has answers for topics the queue does not have: "
                              + ", ".join(f'"{n}"' for n in unknown) + ". Nothing was imported.")
    with answers.updating() as answered:
        differ = sorted(n for n, why in given.items()
                        if answered.get(n, "TBD").strip() not in UNFILLED and answered[n].split() != why.split())
        if differ and not force:
            raise StudyQueueError("your answers file already has other answers for "
                                  + ", ".join(f'"{n}"' for n in differ)
                                  + ". Nothing was imported; pass --force to replace them with the file's.")
        with_answers(queue, given)  # refuses markup the page could not show, before anything is saved
        copied = sorted(n for n, why in given.items() if answered.get(n, "").split() != why.split())
        answered.update({n: given[n] for n in copied})
    return copied


def _answers_in(queue: str) -> dict[str, str]:
    """The filled answers of a Markdown queue, with their line breaks (``why_here`` joins them)."""
    lines = queue.splitlines()
    found = {}
    for topic in parse(queue):
        if topic.filled:
            fld = topic.fields["Why here"]
            first = _FIELD.match(lines[fld.start] + "\n")["value"].strip()
            found[topic.name] = "\n".join([first, *(line.strip() for line in lines[fld.start + 1 : fld.end])])
    return found


def adopt_clone_answers() -> list[str]:
    """Answers a clone's ``book/study-queue.md`` holds from before the answers file existed, copied
    into it for the topics it has no answer for; the clone's file is left as it is."""
    try:
        queue = repo_root() / "book" / "study-queue.md"
    except FileNotFoundError:
        return []
    held = _answers_in(_read(queue))
    if not held or named_queue():
        return []
    with answers.updating() as answered:
        new = sorted(set(held) - set(answered))
        answered.update({n: held[n] for n in new})
    return new


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
    shown = text(path)
    path = Path(path or named_queue() or queue_path())  # its links are relative to its folder
    problems = markup_problems(shown)
    topics = parse(shown)
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

    try:
        topic, trouble = find(load(path), name), ""
    except answers.AnswersError as err:  # the card still shows the topic; saving stays refused
        topic, trouble = find(parse(_read(queue_path())), name), str(err)

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
    status = widgets.HTML(f"<span style='color:#b00'>{html.escape(trouble)}</span>" if trouble else "")

    def on_save(_button) -> None:
        try:
            fill(topic.name, box.value, force=force.value, path=path)
        except (StudyQueueError, answers.AnswersError) as err:
            status.value = f"<span style='color:#b00'>Not saved: {html.escape(str(err))}</span>"
        else:
            status.value = f"Saved to {html.escape(where(path))}."

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

