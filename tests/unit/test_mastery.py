import numpy as np

from posttrainllm import gradient_descent as gd
from posttrainllm import linear
from posttrainllm.tools import mastery


def test_fit_line_gate_passes_the_reference_and_fails_a_stub():
    def reference(x, y):
        return tuple(linear.fit_closed_form(x, y))

    assert mastery.check_fit_line(reference)
    result = mastery.check_fit_line(lambda x, y: None)
    assert not result and len(result.failures) == 4
    assert repr(result).startswith("NOT YET fit_line: 4 of 4 cases fail.")


def test_fit_line_gate_names_the_wrong_numbers_and_the_missing_error():
    def swapped(x, y):
        w, b = linear.fit_closed_form(x, y)
        return b, w

    result = mastery.check_fit_line(swapped)
    assert result.failures[0] == "noisy points: expected (w, b) = [1.3862 0.5185], got [0.5185 1.3862]"
    assert len(result.failures) == 3  # swapping still raises on constant x, so that case passes
    assert "all x equal" in mastery.check_fit_line(lambda x, y: (0.0, 0.0)).failures[-1]

    def crashes(x, y):
        raise ZeroDivisionError("oops")

    assert "raised ZeroDivisionError: oops" in mastery.check_fit_line(crashes).failures[0]


def test_gradient_gate_spots_a_forward_difference_and_in_place_changes():
    assert mastery.check_numerical_gradient(gd.numerical_gradient)

    def forward(f, theta, eps=1e-5):
        return np.array([(f(theta + eps * e) - f(theta)) / eps for e in np.eye(theta.size)])

    result = mastery.check_numerical_gradient(forward)
    assert not result and any("one-sided difference" in f for f in result.failures)

    def mutates(f, theta, eps=1e-5):
        out = gd.numerical_gradient(f, theta.copy())
        theta += 1.0
        return out

    assert all("changed in place" in f for f in mastery.check_numerical_gradient(mutates).failures)
    assert "expected shape (3,)" in mastery.check_numerical_gradient(lambda f, t: np.zeros(1)).failures[0]
