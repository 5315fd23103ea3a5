"""Knobs: a matplotlib figure redrawn as a learner turns sliders.

Unlike ``ipywidgets.interact``, the picture is an ``Image`` widget, not a captured output, so
(1) the static book shows the saved picture from the widget state, and (2) nbval sees only one
stable line of text for the cell (``Knobs(draw_fit: w, b)``), never stray plot messages.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable


def _render_png(draw: Callable[..., None], values: dict) -> bytes:
    import matplotlib.pyplot as plt

    fig = plt.figure()
    try:
        draw(**values)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()
    finally:
        plt.close(fig)


@functools.cache
def _knobs_class() -> type:
    import ipywidgets as widgets

    class Knobs(widgets.VBox):
        """Sliders above a picture that ``draw(**slider values)`` paints with pyplot."""

        def __init__(self, draw: Callable[..., None], controls: dict) -> None:
            self.draw, self.controls = draw, controls
            for name, control in controls.items():
                control.description = control.description or name
                control.observe(self._redraw, names="value")
            self.image = widgets.Image(format="png")
            super().__init__([*controls.values(), self.image])
            self._redraw()

        @property
        def values(self) -> dict:
            return {name: control.value for name, control in self.controls.items()}

        def _redraw(self, _change=None) -> None:
            self.image.value = _render_png(self.draw, self.values)

        def __repr__(self) -> str:
            return f"Knobs({self.draw.__name__}: {', '.join(self.controls)})"

    return Knobs


def knobs(draw: Callable[..., None], **controls) -> object:
    """``knobs(draw_fit, w=FloatSlider(...), b=FloatSlider(...))``: sliders that redraw a figure.

    ``draw`` takes the controls' values as keyword arguments and draws with ``plt`` calls on the
    current figure (no ``plt.show()``); the figure is rendered to PNG on every change.
    """
    if not controls:
        raise ValueError("give at least one control, e.g. w=ipywidgets.FloatSlider(...)")
    return _knobs_class()(draw, controls)
