import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest

from posttrainllm.tools.knobs import knobs


def draw_line(slope=1.0):
    plt.plot([0, 1], [0, slope])


def test_knobs_draws_at_start_and_redraws_when_a_slider_moves():
    panel = knobs(draw_line, slope=widgets.FloatSlider(value=1.0, min=-2, max=2))
    first = bytes(panel.image.value)
    assert first.startswith(b"\x89PNG")
    panel.controls["slope"].value = -1.5
    assert bytes(panel.image.value) != first and panel.values == {"slope": -1.5}
    assert repr(panel) == "Knobs(draw_line: slope)"
    assert plt.get_fignums() == []  # no figure is left open to leak into the cell's output


def test_knobs_needs_a_control():
    with pytest.raises(ValueError, match="at least one control"):
        knobs(draw_line)
