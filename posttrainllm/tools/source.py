"""Show a package object's source in a notebook, so notebooks teach the real code, not a copy."""

from __future__ import annotations

import inspect


class Source:
    """Highlighted source in Jupyter and the book; the plain source text everywhere else.

    Notebooks store the plain text too, so nbval notices when the package code changes.
    """

    def __init__(self, *objs: object) -> None:
        self.name = ", ".join(f"{obj.__module__}.{obj.__qualname__}" for obj in objs)
        self.code = "\n".join(inspect.getsource(obj) for obj in objs)

    def __repr__(self) -> str:
        return f"# {self.name}\n{self.code}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        body = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True))
        return f"<p><code>{self.name}</code></p>{body}"


def show_source(obj: object, *more: object) -> Source:
    """``show_source(posttrainllm.linear.mse)`` displays that function's code, highlighted; given
    more objects, each one's code in turn."""
    return Source(obj, *more)
