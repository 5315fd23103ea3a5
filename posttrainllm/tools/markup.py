"""What a reader's text may contain when it is shown on a page of the book.

A study answer is rendered by the book's Markdown parser, so it is judged by that parser, not by
a hand-written scanner: :func:`parser` builds markdown-it with the plugins MyST uses for this
book (``myst_parser.parsers.mdit.create_md_parser`` with ``_config.yml``'s extensions; a test
compares the two token streams), and :func:`refusal` accepts only what it lists as safe: one
paragraph of text, code spans, emphasis, inline math and web links. Anything else (HTML, images,
roles, substitutions, headings, rules, fences, comments, tables) is refused with its name, so an
answer can neither leave its field nor put markup or code of its own into the built page.
"""

from __future__ import annotations

import functools
import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

_SAFE_INLINE = {"text", "softbreak", "hardbreak", "code_inline", "em_open", "em_close", "strong_open",
                "strong_close", "link_open", "link_close", "math_inline"}
_WEB = ("https://", "http://")
# MathJax macros that reach the page's HTML (links, classes, styles, extensions loaded at read time)
_HTML_TEX = re.compile(r"\\(href|class|cssId|style|require|unicode|data|html|texttip|mathtip|toggle)(?![A-Za-z])")

# what a refused token is called in the message a reader sees
_NAMES = {
    "html_inline": "an HTML tag", "html_block": "an HTML block", "image": "an image",
    "myst_role": "a MyST role ({name}`...`)", "substitution_inline": "a template substitution ({{ ... }})",
    "substitution_block": "a template substitution ({{ ... }})", "heading_open": "a heading",
    "hr": "a horizontal rule", "fence": "a code block", "code_block": "an indented code block",
    "colon_fence": "a ::: directive", "math_block": "a $$ math block", "amsmath": "a math environment",
    "myst_line_comment": "a % comment line (hidden on the page)", "myst_block_break": "a +++ block break",
    "myst_target": "a (label)= target", "blockquote_open": "a quote", "table_open": "a table",
    "bullet_list_open": "a list", "ordered_list_open": "a list", "dl_open": "a definition list",
    "footnote_ref": "a footnote", "footnote_block_open": "a footnote", "front_matter": "front matter",
}


@functools.cache
def parser() -> MarkdownIt:
    """markdown-it configured as MyST configures it for this book (``_config.yml``: dollarmath,
    amsmath, colon_fence, deflist, linkify), plus the substitution plugin so that template syntax
    is seen and refused even where a page would enable it."""
    from mdit_py_plugins.amsmath import amsmath_plugin
    from mdit_py_plugins.colon_fence import colon_fence_plugin
    from mdit_py_plugins.deflist import deflist_plugin
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.footnote import footnote_plugin
    from mdit_py_plugins.front_matter import front_matter_plugin
    from mdit_py_plugins.myst_blocks import myst_block_plugin
    from mdit_py_plugins.myst_role import myst_role_plugin
    from mdit_py_plugins.substitution import substitution_plugin

    md = (
        MarkdownIt("commonmark")
        .enable("table")
        .use(front_matter_plugin)
        .use(myst_block_plugin)
        .use(myst_role_plugin)
        .use(footnote_plugin)
        .disable("footnote_inline")
        .disable("footnote_tail")
        .enable("linkify")
        .use(dollarmath_plugin, allow_labels=True, allow_space=True, allow_digits=True, double_inline=False)
        .use(colon_fence_plugin)
        .use(amsmath_plugin)
        .use(deflist_plugin)
        .use(substitution_plugin)
    )
    md.options["linkify"] = True
    md.linkify.set({"fuzzy_link": True})  # MyST's default (myst_linkify_fuzzy_links)
    return md


def _name(token: Token) -> str:
    return _NAMES.get(token.type, f"markup the book does not allow here ({token.type})")


def refusal(document: str, start: int, end: int) -> str | None:
    """Why the field on lines ``start:end`` of ``document`` (a ``- Name: value`` list item, its
    continuation lines indented) may not go on a page, or ``None`` if the page shows it as one
    paragraph of text in its own list item. The whole document is parsed, so the verdict is the
    one the page gets, with the lines around the field in place."""
    tokens = parser().parse(document)
    first = next((i for i, t in enumerate(tokens) if t.type == "list_item_open" and t.map and t.map[0] == start), None)
    if first is None:
        return "it would change the list the field belongs to"
    inner = tokens[first + 1 : first + 4]
    if [t.type for t in inner] != ["paragraph_open", "inline", "paragraph_close"] or inner[0].map != [start, end]:
        extra = next((t for t in tokens[first + 1 :] if t.type not in ("paragraph_open", "inline",
                                                                       "paragraph_close")), None)
        if extra is None or extra.type in ("list_item_close", "list_item_open"):
            return "it would render as more than one paragraph, ending the field"
        return f"it would render as {_name(extra)}, which the answer's field cannot hold"
    for token in inner[1].children or []:
        if token.type not in _SAFE_INLINE:
            return f"it holds {_name(token)}, which the book would render as markup, not as your words"
        if token.type == "link_open" and not str(token.attrGet("href") or "").startswith(_WEB):
            return "it links to something other than a web address (http:// or https://)"
        if token.type == "math_inline" and (macro := _HTML_TEX.search(token.content)):
            return f"its maths uses {macro[0]}, which MathJax turns into HTML of its own"
    return None
