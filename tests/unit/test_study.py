import multiprocessing
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm.tools import study
from posttrainllm.tools.cli import main
from tests.conftest import WITHOUT_TORCH

ROOT_QUEUE = study.queue_path()

# The 19 topics of the seed study queue, under their exact names.
SEED_TOPICS = [
    "Backpropagation & gradient descent",
    "Next-token language modeling & sampling",
    "Memorization testing (style-adaptation eval)",
    "Transformer / scaled-dot-product attention",
    "Flash Attention 2 (FA2)",
    "Online softmax",
    "Byte-Pair Encoding (BPE) tokenization",
    "WebAssembly (WASM) + Emscripten",
    "WASM SIMD + multi-threading",
    "WebGPU + WGSL",
    "Tiled / register-blocked matrix multiplication (GPU)",
    "fp16 / mixed-precision",
    "Sparse Autoencoder (SAE) / mechanistic interpretability",
    "Logit lens",
    "Gradient checkpointing (activation recomputation)",
    "AdamW optimizer",
    "LoRA (Low-Rank Adaptation)",
    "Speculative decoding (draft + verify)",
    "Continual learning / online adapter refresh",
]
WITH_GOTCHA = {
    "Transformer / scaled-dot-product attention",
    "Flash Attention 2 (FA2)",
    "WebAssembly (WASM) + Emscripten",
    "WebGPU + WGSL",
    "Tiled / register-blocked matrix multiplication (GPU)",
    "fp16 / mixed-precision",
    "AdamW optimizer",
    "Speculative decoding (draft + verify)",
}


def test_queue_has_all_19_seed_topics_with_their_fields():
    topics = study.load(ROOT_QUEUE)
    assert [t.name for t in topics] == SEED_TOPICS
    for topic in topics:
        assert topic.get("What") and topic.get("Source").startswith("http"), topic.name
        assert "Why here" in topic.fields, topic.name
        assert bool(topic.get("Gotcha (from code)")) == (topic.name in WITH_GOTCHA), topic.name


def test_every_topic_has_a_teaching_anchor_that_exists():
    assert study.check(ROOT_QUEUE) == []


def test_fill_changes_only_the_why_here_line(queue_copy):
    before = queue_copy.read_bytes()
    topic = study.fill("Online softmax", "The WGSL kernel sees one tile of scores at a time.", path=queue_copy)
    after = queue_copy.read_bytes()
    assert topic.why_here == "The WGSL kernel sees one tile of scores at a time."
    old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True)) if a != b]
    assert len(changed) == 1
    assert new_lines[changed[0]] == b"- Why here: The WGSL kernel sees one tile of scores at a time.\n"
    # and filling the old value back restores the file byte for byte
    study.fill("Online softmax", "TBD", path=queue_copy, force=True)
    assert queue_copy.read_bytes() == before


def test_fill_keeps_crlf_line_endings_and_a_missing_final_newline(tmp_path):
    path = tmp_path / "q.md"
    original = b"# Q\r\n\r\n## A\r\n- What: a\r\n- Why here: TBD\r\n- Source: http://a\r\n\r\n## B\r\n- Why here: TBD"
    path.write_bytes(original)
    study.fill("A", "first", path=path)
    study.fill("B", "last line", path=path)
    assert path.read_bytes() == original.replace(b"TBD\r\n", b"first\r\n").replace(
        b"- Why here: TBD", b"- Why here: last line"
    )


def test_multiline_answers_become_indented_continuation_lines(queue_copy):
    study.fill("Logit lens", "Line one\nline two", path=queue_copy)
    text = queue_copy.read_text(encoding="utf-8")
    assert "- Why here: Line one\n  line two\n- Source:" in text
    assert study.find(study.load(queue_copy), "Logit lens").why_here == "Line one line two"


@settings(max_examples=60, deadline=None)
@given(
    answer=st.lists(
        st.text(st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"]), min_size=1).filter(str.strip),
        min_size=1,
        max_size=3,
    )
)
def test_any_unicode_answer_round_trips_or_is_refused_and_nothing_else_moves(answer):
    name = "LoRA (Low-Rank Adaptation)"
    text = ROOT_QUEUE.read_text(encoding="utf-8")
    try:
        new = study.filled_text(text, name, "\n".join(answer), force=True)
    except study.StudyQueueError as err:  # refused only for markup the page would not show as text
        assert "was not saved" in str(err)
        return
    assert study.find(study.parse(new), name).why_here == " ".join(a.strip() for a in answer)
    assert [t.name for t in study.parse(new)] == SEED_TOPICS
    old_field = study.find(study.parse(text), name).fields["Why here"]
    new_field = study.find(study.parse(new), name).fields["Why here"]
    old_lines, new_lines = text.splitlines(keepends=True), new.splitlines(keepends=True)
    assert old_lines[: old_field.start] == new_lines[: new_field.start]
    assert old_lines[old_field.end :] == new_lines[new_field.end :]


def test_unknown_topic_names_the_closest_topics(queue_copy):
    with pytest.raises(study.StudyQueueError) as err:
        study.fill("Online softmx", "x", path=queue_copy)
    assert 'no study-queue topic is named "Online softmx"' in str(err.value)
    assert '"Online softmax"' in str(err.value)
    with pytest.raises(study.StudyQueueError, match='"LoRA \\(Low-Rank Adaptation\\)"'):
        study.fill("lora", "x", path=queue_copy)
    with pytest.raises(study.StudyQueueError, match="No close match"):
        study.fill("Quantum chromodynamics", "x", path=queue_copy)


def test_an_existing_answer_needs_force(queue_copy):
    study.fill("Logit lens", "mine", path=queue_copy)
    snapshot = queue_copy.read_bytes()
    with pytest.raises(study.StudyQueueError, match="already has an answer.*--force"):
        study.fill("Logit lens", "someone else's", path=queue_copy)
    assert queue_copy.read_bytes() == snapshot
    assert study.fill("Logit lens", "revised", path=queue_copy, force=True).why_here == "revised"


@pytest.mark.parametrize("text", ["", "   ", "one\n\ntwo"])
def test_empty_or_multi_paragraph_answers_are_refused(queue_copy, text):
    snapshot = queue_copy.read_bytes()
    with pytest.raises(study.StudyQueueError):
        study.fill("Logit lens", text, path=queue_copy)
    assert queue_copy.read_bytes() == snapshot


def test_a_failed_write_leaves_the_file_and_no_temporary(queue_copy, monkeypatch):
    snapshot = queue_copy.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        study.fill("Logit lens", "x", path=queue_copy)
    assert queue_copy.read_bytes() == snapshot
    assert sorted(p.name for p in queue_copy.parent.iterdir()) == [".study-queue.md.lock", "study-queue.md"]


def _fill_one(args):
    path, name = args
    study.fill(name, f"answer for {name}", path=path)


def test_concurrent_fills_do_not_lose_each_others_answers(queue_copy):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_fill_one, [(queue_copy, name) for name in SEED_TOPICS])
    topics = study.load(queue_copy)
    assert all(t.why_here == f"answer for {t.name}" for t in topics)


def test_check_reports_missing_files_sections_and_anchors(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01-x.ipynb").write_text(
        '{"cells": [{"cell_type": "markdown", "source": ["# Title\\n", "## Real section\\n"]}]}'
    )
    queue = tmp_path / "book" / "study-queue.md"
    queue.write_text(
        "## A\n- What: a\n- Why here: TBD\n- Source: http://a\n"
        "- Taught in: [ok](../notebooks/01-x.ipynb#real-section), [typo](../notebooks/01-x.ipynb#real-sectoin)\n"
        "## B\n- What: b\n- Why here: TBD\n- Source: http://b\n- Taught in: [gone](../notebooks/99.ipynb#x)\n"
        "## C\n- What: c\n- Why here: TBD\n- Source: http://c\n"
        "- Gotcha: see `webgpu/attention_fa2.wgsl` and `notebooks/01-x.ipynb`\n"
    )
    problems = study.check(queue)
    assert problems == [
        '"A": [typo] points to section #real-sectoin of ../notebooks/01-x.ipynb, which has no such '
        'section (closest: "#real-section")',
        '"B": [gone] points to ../notebooks/99.ipynb, which does not exist',
        '"C": no teaching anchor (a "- Taught in: [..](..)" link)',
        '"C": names `webgpu/attention_fa2.wgsl`, which does not exist',
    ]


def test_slugify_matches_myst_on_every_heading_of_the_book():
    myst = pytest.importorskip("myst_parser.mdit_to_docutils.base")
    root = ROOT_QUEUE.parents[1]
    pages = [*root.glob("notebooks/*.ipynb"), *root.glob("book/*.md")]
    titles = [title for page in pages for title, _ in study.headings(page, max_level=6)]
    assert len(titles) > 30
    for title in titles:
        assert study.slugify(title) == myst.default_slugify(title)


def test_study_card_saves_through_the_same_writer(queue_copy):
    card = study.card("Online softmax", path=queue_copy)
    assert repr(card) == "StudyCard('Online softmax')"
    _info, box, buttons, status = card.children
    save = buttons.children[0]
    box.value = "Because attention is a softmax over tiles."
    save.click()
    assert "Saved" in status.value
    assert study.find(study.load(queue_copy), "Online softmax").why_here == box.value
    save.click()  # a second save without "replace" is refused, visibly
    assert "Not saved" in status.value and "already has an answer" in status.value


def test_cli_status_fill_check(queue_copy, capsys):
    assert main(["study", "--file", str(queue_copy), "fill", "Logit lens", "It shows depth."]) == 0
    assert main(["study", "--file", str(queue_copy), "status"]) == 0
    out = capsys.readouterr().out
    assert "1 of 19 topics have a 'Why here' (18 TBD)" in out
    assert "[filled] Logit lens" in out and "[TBD   ] Online softmax" in out
    assert main(["study", "check"]) == 0  # the checkout's own queue
    assert main(["study", "--file", str(queue_copy), "fill", "Logit len", "x"]) == 2
    assert 'Did you mean: "Logit lens"?' in capsys.readouterr().err


def test_the_console_script_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "study", "status"], capture_output=True, text=True, check=True
    ).stdout
    assert sum(line.startswith("[") for line in out.splitlines()) == 19 and "taught in:" in out


def test_a_read_only_queue_is_refused_and_a_writable_one_keeps_its_mode(queue_copy):
    before = queue_copy.read_bytes()
    queue_copy.chmod(0o444)
    with pytest.raises(study.StudyQueueError, match="read-only"):
        study.fill("Online softmax", "An answer.", path=queue_copy)
    assert queue_copy.read_bytes() == before
    queue_copy.chmod(0o640)
    study.fill("Online softmax", "An answer.", path=queue_copy)
    assert queue_copy.stat().st_mode & 0o7777 == 0o640


# Each answer the page's Markdown parser would render as something other than one paragraph of text
# in its field: the field would end, or markup or a template of the reader's would reach the build.
HOSTILE = [
    ("Fine.\n## Fake topic", "a heading"),
    ("Fine.\n- What: injected", "a list"),
    ("Fine.\n1. one", "a list"),
    ("See <script>alert(1)</script>", "an HTML tag"),
    ("Fine.\n<div onclick=x>", "an HTML block"),
    ("<!-- hidden -->", "an HTML tag"),
    ("\\`<img src=x onerror=alert(1)>\\`", "an HTML tag"),  # `\`` is not a code span in Markdown
    ("{{ lipsum.__globals__['os'].popen('id').read() }}", "a template substitution"),
    ("Fine.\n> quoted", "a quote"),
    ("Fine.\n| a | b |\n| - | - |", "a table"),
    ("Fine.\n===", "a heading"),
    ("Fine.\n---", "a heading"),
    ("Fine.\n***", "a horizontal rule"),
    ("Fine.\n% vanishes", "a % comment"),
    ("Fine.\n:::", "a ::: directive"),
    ("Fine.\n```", "a code block"),
    ("Fine.\n+++", "a \\+\\+\\+ block break"),
    ("Fine.\n(label)=", "a \\(label\\)= target"),
    ("Fine.\n\\begin{align}x\\end{align}", "a math environment"),
    ("term\n: definition", "a definition list"),
    ("{download}`x`", "a MyST role"),
    ("![x](https://example.org/a.png)", "an image"),
    ("[notes](other-page.md)", "web address"),
    ("$\\href{javascript:alert(1)}{x}$", "MathJax turns into HTML"),
    ("$\\require{action}\\toggle{a}{b}$", "MathJax turns into HTML"),
]


@pytest.mark.parametrize("answer, why", HOSTILE)
def test_an_answer_that_would_not_render_as_its_text_is_refused(queue_copy, answer, why):
    before = queue_copy.read_bytes()
    with pytest.raises(study.StudyQueueError, match=f"was not saved: .*{why}"):
        study.fill("Online softmax", answer, path=queue_copy)
    assert queue_copy.read_bytes() == before


KEPT = [
    "Because x < y holds for the max, and `<T>` is code.",
    "A running max $m_i$ keeps **one** pass, see https://arxiv.org/abs/1805.02867",
    "[the paper](https://arxiv.org/abs/1805.02867) and `{{ not a template }}` in code",
    "> at the start of the field is only text",
    "$$\ninline maths only\n$$",
]


@pytest.mark.parametrize("answer", KEPT)
def test_text_code_maths_and_web_links_are_kept(queue_copy, answer):
    study.fill("Online softmax", answer, path=queue_copy)
    assert study.markup_problems(queue_copy.read_text(encoding="utf-8")) == []


def test_a_hand_edited_answer_with_markup_is_reported_by_check(queue_copy):
    text = queue_copy.read_text(encoding="utf-8")
    topic = study.find(study.parse(text), "Online softmax")
    lines = text.splitlines(keepends=True)
    lines[topic.fields["Why here"].start] = "- Why here: see <img src=x onerror=alert(1)>\n"
    queue_copy.write_text("".join(lines), encoding="utf-8")
    assert any("Online softmax" in p and "HTML tag" in p for p in study.check(queue_copy))
    assert study.markup_problems(ROOT_QUEUE.read_text(encoding="utf-8")) == []


def test_the_answer_parser_is_the_books(queue_copy):
    """markup.parser() must tokenise as MyST does with _config.yml's extensions, or its verdicts
    would be about some other page than the one the book builds."""
    yaml = pytest.importorskip("yaml")
    mdit = pytest.importorskip("myst_parser.parsers.mdit")
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig

    from posttrainllm.tools import markup
    from tests.conftest import ROOT

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    extensions = config["parse"]["myst_enable_extensions"]
    myst = mdit.create_md_parser(MdParserConfig(enable_extensions=extensions), RendererHTML)
    text = queue_copy.read_text(encoding="utf-8")
    def tokens(md, page):
        return [(t.type, t.map, [(c.type, c.attrs, c.content) for c in t.children or []]) for t in md.parse(page)]

    for answer in [a for a, _ in HOSTILE] + KEPT + ["see example.org and www.example.org/a"]:
        page = text + "\n## Probe\n- Why here: " + "\n  ".join(answer.splitlines()) + "\n- Source: x\n"
        ours, theirs = tokens(markup.parser(), page), tokens(myst, page)
        if "{{" not in answer:  # the book has no substitution extension; ours sees templates on purpose
            assert ours == theirs, answer


def test_cli_gives_one_error_line_for_bad_paths(tmp_path, capsys):
    binary = tmp_path / "queue.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 10)
    for path, words in [(tmp_path, "is a folder"), (binary, "not UTF-8"), (tmp_path / "nope.md", "No such file")]:
        assert main(["study", "--file", str(path), "status"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and err.count("\n") == 1 and "Traceback" not in err


def test_status_into_a_closed_pipe_exits_quietly():  # as in `posttrainllm study status | head -1`
    proc = subprocess.Popen([sys.executable, "-m", "posttrainllm", "study", "status"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and err == ""


def test_force_replaces_an_answer_that_a_hand_edit_wrapped_without_indenting(tmp_path):
    queue = tmp_path / "study-queue.md"
    queue.write_text("## A\n- What: x\n- Why here: my first try,\nwrapped by hand\nand again\n\n"
                     "## B\n- Why here: TBD\n")
    assert study.load(queue)[0].why_here == "my first try, wrapped by hand and again"
    study.fill("A", "a better answer", force=True, path=queue)
    assert queue.read_text() == "## A\n- What: x\n- Why here: a better answer\n\n## B\n- Why here: TBD\n"
    assert [t.why_here for t in study.load(queue)] == ["a better answer", "TBD"]


def test_cli_version_and_plain_help(capsys):
    import posttrainllm

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"posttrainllm {posttrainllm.__version__}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out  # no reST markup in a terminal


def test_models_without_torch_is_one_line_naming_the_extra():
    hide_torch = WITHOUT_TORCH + "import sys\nfrom posttrainllm.tools.cli import main\nsys.exit(main(['models']))\n"
    done = subprocess.run([sys.executable, "-c", hide_torch], capture_output=True, text=True,
                          env={**os.environ, "POSTTRAINLLM_CACHE": os.devnull + "-unused"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "pip install 'posttrainllm[torch]'" in done.stderr
