"""Progress bars for the package's training loops, drawn only when someone is waiting on them.

Each loop iterates over :func:`steps` instead of ``range``. Outside :func:`shown` that is a plain
``range`` (a notebook's stored outputs never hold a bar); inside it, every loop that runs draws a
bar labelled with what is being built, so a reader who trains the shared models
(``posttrainllm models``, ``make book``) sees each one move and how long it has left.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterable, Iterator

_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("posttrainllm_progress", default=None)


def steps(n: int, what: str = "", *, show: bool = False) -> Iterable[int]:
    """``range(n)``, with a bar inside :func:`shown` or when ``show`` is set (``what`` names this
    loop, e.g. "SFT")."""
    label = _LABEL.get() or ("training" if show else None)
    if label is None:
        return range(n)
    from tqdm import tqdm

    desc = f"{label}: {what}" if what else label
    return tqdm(range(n), desc=desc, unit="step", leave=False, file=sys.stderr, dynamic_ncols=True)


@contextlib.contextmanager
def shown(label: str) -> Iterator[None]:
    """Inside the block, the training loops that :func:`steps` drives show bars named ``label``."""
    token = _LABEL.set(label)
    try:
        yield
    finally:
        _LABEL.reset(token)
