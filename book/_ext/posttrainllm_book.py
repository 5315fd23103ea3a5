"""Sphinx glue for the book: pages whose content is computed from the checkout at build time.

- ``book/study-queue``: each topic gets its status (filled / TBD), and the page opens with a
  summary table, all read from the same file by ``posttrainllm.tools.study``;
- ``book/coverage``: the coverage map, from ``posttrainllm.tools.coverage``;
- ``book/mastery``: every mastery gate, where it is run and its kind (``coverage.mastery_table``);
- ``book/notebook-times``: the notebook time-budget report that ``make test`` wrote (or, in a build
  without tests, the committed one);
- ``book/benchmarks``: the result tables committed under ``benchmarks/results/``;
- ``book/math-vs-engineering``: the loss-drift table (``benchmarks/drift.py``).

A page marks where generated text goes with a line ``<!-- generated: NAME -->``.

It also makes the kernels that myst-nb starts for executed pages (the reference shelf)
encrypt their channels with CurveZMQ, as the ipykernel warning about plain TCP asks: myst-nb
passes no kernel-manager settings through, so the default is set here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lite_site
from docutils import nodes

from posttrainllm.tools import answers, coverage, lite, study

ROOT = Path(__file__).resolve().parents[2]
TIMES = ROOT / "_build" / "reports" / "notebook-times.json"
COMMITTED_TIMES = ROOT / "book" / "notebook-times.json"  # the last full run's, for a build without tests
RESULTS = ROOT / "benchmarks" / "results"


def _status(topic: study.Topic) -> str:
    return "filled" if topic.filled else "TBD"


def _links(topic: study.Topic) -> str:
    return ", ".join(f"[{label}]({target})" for label, target in topic.taught_in)


def study_queue_page(text: str) -> str:
    """The queue with the reader's own answers (a reader's build shows theirs; CI's has none)."""
    problems = study.markup_problems(text)
    if problems:  # a hand edit: the page would run or show markup the reader did not mean as text
        raise ValueError("book/study-queue.md: " + "; ".join(problems) + " (`posttrainllm study check` lists these)")
    try:
        text = study.with_answers(text, answers.load())
    except study.StudyQueueError as err:
        raise ValueError(f"your study answers ({answers.path()}) cannot go on the page: {err}") from None
    topics = study.parse(text)
    lines = text.splitlines(keepends=True)
    for topic in reversed(topics):  # insert bottom-up so earlier line numbers stay valid
        mark = "**Status:** filled" if topic.filled else "**Status:** TBD (the Why here is yours to fill)"
        lines.insert(topic.line + 1, f"\n{mark}\n\n")
    filled = sum(t.filled for t in topics)
    table = [
        f"\n**{filled} of {len(topics)} topics filled.**\n\n",
        "| Topic | Why here | Taught in |\n| --- | --- | --- |\n",
        *(f"| {t.name} | {_status(t)} | {_links(t)} |\n" for t in topics),
        "\n",
    ]
    first = topics[0].line if topics else len(lines)
    return "".join(lines[:first] + table + lines[first:])


def notebook_times_table() -> str:
    """This build's timing report when `make test` wrote one; otherwise the committed one
    (``book/notebook-times.json``, refreshed with ``make notebook-times`` after a full run)."""
    if TIMES.is_file():
        report, source = json.loads(TIMES.read_text(encoding="utf-8")), "during this build's `make test`"
    else:
        report = json.loads(COMMITTED_TIMES.read_text(encoding="utf-8"))
        source = f"by {report['measured']} (this build ran no tests; `make test` measures afresh)"
    rows = [
        f"Measured on {report['machine']} {source}; a notebook fails the suite only "
        f"past {report['fail_factor']:g}× its budget.\n",
        "| Notebook | Budget (s) | Measured (s) | Of budget |\n| --- | ---: | ---: | ---: |",
    ]
    for name, entry in sorted(report["notebooks"].items()):
        share = entry["seconds"] / entry["budget_s"]
        rows.append(f"| {name} | {entry['budget_s']:g} | {entry['seconds']:.1f} | {share:.0%} |")
    return "\n".join(rows) + "\n"


def result_table(path: Path) -> list[str]:
    """One result file of ``benchmarks/results`` as a Markdown table with its provenance."""
    result = json.loads(path.read_text(encoding="utf-8"))
    columns = result["columns"]
    return [
        f"`benchmarks/results/{path.name}`, measured on {result['machine']}.\n",
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
        *("| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in result["rows"]),
        f"\n{result['notes']}\n",
    ]


def benchmark_tables() -> str:
    results = sorted(RESULTS.glob("*.json"))
    if not results:
        return "No benchmark results are committed yet.\n"
    parts = []
    for path in results:
        title = json.loads(path.read_text(encoding="utf-8"))["title"]
        parts += [f"## {short_title(title)}\n", f"*{title}.*\n", *result_table(path)]
    return "\n".join(parts)


def short_title(title: str) -> str:
    """A section heading from a result's title: the part before its first colon or parenthesis
    (the full title follows as the section's first line).

    >>> short_title("WGSL matmul through wgpu-py on NVIDIA H200 (DiscreteGPU, Vulkan)")
    'WGSL matmul through wgpu-py on NVIDIA H200'
    """
    return title.split(":")[0].split(" (")[0].strip()


def drift_table() -> str:
    """The drift table; a row past its bound stops the build rather than being published."""
    path = RESULTS / "drift.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    past = [row[0] for row in result["rows"] if row[result["columns"].index("within")] != "yes"]
    if past:
        raise ValueError(f"{path}: past their drift bounds: {past}")
    return "\n".join(result_table(path))


GENERATED = {
    "benchmarks": benchmark_tables,
    "drift": drift_table,
    "coverage-map": lambda: coverage.markdown_table(ROOT),
    "mastery": lambda: coverage.mastery_table(ROOT),
    "notebook-times": notebook_times_table,
}


def on_source_read(app, docname: str, source: list[str]) -> None:
    if docname == "book/study-queue":
        source[0] = study_queue_page(source[0])
    for name, render in GENERATED.items():
        marker = f"<!-- generated: {name} -->"
        if marker in source[0]:
            source[0] = source[0].replace(marker, render())


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    """sphinx-thebe and sphinx-togglebutton register their inline scripts twice under JB 1.0.4;
    the second ``const THEBE_JS_URL`` is a SyntaxError in every page's console."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # the second copy has filename "" where the first has None: compare them as equal
        key = (getattr(script, "filename", script) or "", repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


RUN_IN_BROWSER = """<div class="admonition tip ptl-lite"><p class="admonition-title">Run in your browser</p>
<p><a class="ptl-lite-link" href="{href}">Open this module's browser edition</a>: JupyterLite runs it in
this tab on Pyodide (Python compiled to WebAssembly), with no install and no server. Cells that need
PyTorch, tiktoken, wgpu-py or a file of the book's repository are left out, and numpy and matplotlib
are downloaded once from the Pyodide CDN, so the first visit needs the network.
<a href="{page}">What runs in the browser</a>.</p></div>"""
NEEDS_PYTORCH = """<div class="admonition note ptl-lite-note"><p class="admonition-title">Needs PyTorch</p>
<p>This module trains with PyTorch throughout, and PyTorch does not run in the browser, so it has no
browser edition: run it locally (<code>make lab</code>) or on Colab (the launch button at the top of
the page). <a href="{page}">What runs in the browser</a>.</p></div>"""


def add_browser_links(app, doctree) -> None:
    """A notebook page says, under its title, whether it runs in the browser (posttrainllm.tools.lite)."""
    docname = app.env.docname
    section = doctree.next_node(nodes.section)
    if not docname.startswith("notebooks/") or section is None:
        return
    stem, up = docname.split("/")[-1], "../" * docname.count("/")
    page = f"{up}book/in-your-browser.html"
    if stem in lite.IN_BROWSER:
        html = RUN_IN_BROWSER.format(href=f"{up}lite/notebooks/index.html?path=notebooks/{stem}.ipynb", page=page)
    else:
        html = NEEDS_PYTORCH.format(page=page)
    section.insert(1, nodes.raw("", html, format="html"))


def build_shared_models(app, env, docnames: list[str]) -> None:
    """Before any page that executes at build time (``execution_mode: force``: the reference shelf)
    is read, train the shared models it loads that the cache lacks, each with a progress bar, so a
    first build never trains them inside a chapter's timed cell."""
    executed = [d for d in docnames if "execution_mode: force" in Path(env.doc2path(d)).read_text(encoding="utf-8")]
    if executed:
        from posttrainllm.tools import models

        print(f"the shared models that {len(executed)} executed pages load:", flush=True)
        models.build_all(out=sys.stdout)


def encrypt_kernel_channels() -> None:
    from jupyter_client.manager import KernelManager

    KernelManager.transport_encryption.default_value = "auto"  # used when the kernelspec supports curve


def setup(app):
    encrypt_kernel_channels()
    app.connect("env-before-read-docs", build_shared_models)
    app.connect("source-read", on_source_read)
    app.connect("html-page-context", drop_duplicate_scripts)
    app.connect("doctree-read", add_browser_links)
    # the JupyterLite site (on by default); a test's small book of a page or two turns it off
    app.add_config_value("posttrainllm_lite_site", True, "html", types=[bool])
    app.connect("build-finished", lite_site.on_build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
