import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm.autograd import Value, draw
from posttrainllm.tools import mastery

# A random program: each step applies an operation to earlier nodes (so nodes are reused,
# giving shared sub-expressions) and the output sums the last few nodes. `ops` supplies the
# functions (this engine's, or torch's), so one program runs on both.
UNARY = {
    "neg": lambda a, ops: -a,
    "exp_tanh": lambda a, ops: ops.exp(ops.tanh(a)),
    "log1_sq": lambda a, ops: ops.log(a * a + 1),
    "tanh": lambda a, ops: ops.tanh(a),
    "relu": lambda a, ops: ops.relu(a),
    "sigmoid": lambda a, ops: ops.sigmoid(a),
    "square": lambda a, ops: a**2,
    "cube": lambda a, ops: ops.tanh(a) ** 3,
    "rsub": lambda a, ops: 2.5 - a,
    "rdiv": lambda a, ops: 1.0 / (a * a + 0.5),
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b * b + 1),
    "radd_mul": lambda a, b: 0.5 * a + 3 + b,
}


def run(program, leaves, ops):
    nodes = list(leaves)
    for kind, op, i, j in program:
        a, b = nodes[i % len(nodes)], nodes[j % len(nodes)]
        nodes.append(UNARY[op](a, ops) if kind == "unary" else BINARY[op](a, b))
    result = nodes[-1]
    for extra in nodes[-3:-1]:
        result = result + extra
    return result


class ValueOps:
    exp, log, tanh, sigmoid, relu = Value.exp, Value.log, Value.tanh, Value.sigmoid, Value.relu


program_steps = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY)), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)), st.integers(0, 50), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(
    program=st.lists(program_steps, min_size=1, max_size=12),
    leaves=st.lists(st.floats(-2, 2, allow_nan=False), min_size=1, max_size=4),
)
def test_gradients_match_pytorch_float64_on_random_graphs(program, leaves):
    ours = [Value(x) for x in leaves]
    out = run(program, ours, ValueOps)
    out.backward()
    theirs = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in leaves]
    reference = run(program, theirs, torch)
    if not reference.requires_grad:  # the output did not depend on any leaf
        return
    reference.backward()
    assert out.data == pytest.approx(reference.item(), rel=1e-12, abs=1e-12)
    for v, t in zip(ours, theirs, strict=True):
        expected = 0.0 if t.grad is None else t.grad.item()
        assert abs(v.grad - expected) <= 1e-10 * max(1.0, abs(expected))


def test_a_node_used_twice_gets_both_contributions():
    a = Value(3.0)
    (a * a + a).backward()  # d/da (a^2 + a) = 2a + 1
    assert a.grad == 7.0


def test_backward_twice_doubles_leaf_gradients_but_not_intermediate_ones():
    a, b = Value(2.0), Value(-3.0)
    mid = a * b
    out = mid.tanh()
    out.backward()
    first_a, first_mid = a.grad, mid.grad
    out.backward()
    assert a.grad == 2 * first_a and mid.grad == first_mid


def test_backward_is_iterative_so_deep_graphs_work():
    x = Value(1.0)
    y = x
    for _ in range(100_000):
        y = y + 1.0
    y.backward()
    assert x.grad == 1.0


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda: Value(1.0) + "a", TypeError, "unsupported operand for Value \\+: str"),
        (lambda: 2 * Value(1.0) * [1], TypeError, "unsupported operand for Value \\*: list"),
        (lambda: Value("1"), TypeError, "Value holds an int or float"),
        (lambda: Value(True), TypeError, "Value holds an int or float"),
        (lambda: Value(float("nan")), ValueError, "NaN"),
        (lambda: Value(0.0).log(), ValueError, "log of a non-positive value"),
        (lambda: Value(-1.0).log(), ValueError, "log of a non-positive value"),
        (lambda: Value(-2.0) ** 0.5, ValueError, "negative base"),
        (lambda: Value(2.0) ** Value(2.0), TypeError, "exponent"),
        (lambda: Value(0.0) ** -1, ZeroDivisionError, "division by zero"),
        (lambda: 1 / Value(0.0), ZeroDivisionError, "division by zero"),
        (lambda: Value(1000.0).exp(), OverflowError, "range"),
    ],
)
def test_bad_input_raises_a_clear_error_never_nan(bad, error, message):
    with pytest.raises(error, match=message):
        bad()


def test_sigmoid_is_stable_at_extremes():
    assert Value(-1000.0).sigmoid().data == 0.0 and Value(1000.0).sigmoid().data == 1.0


def test_draw_lists_every_node_and_renders_svg():
    a, b = Value(2.0, label="a"), Value(-3.0, label="b")
    out = (a * b).tanh()
    out.backward()
    drawing = draw(out)
    lines = repr(drawing).splitlines()
    assert sorted(line.split(" = ")[0] for line in lines[:2]) == ["a", "b"]  # the leaves come first
    assert lines[2].startswith("n2 = *(") and lines[-1].startswith("n3 = tanh(n2)")
    svg = drawing._repr_svg_()
    assert svg.startswith("<svg") and svg.count("<rect") == 4 and svg.count("<line") == 3


def test_softplus_gate_accepts_a_correct_rule_and_catches_assignment_instead_of_accumulation():
    def make(rule):
        def softplus(x):
            out = Value(math.log1p(math.exp(x.data)), parents=(x,), op="softplus")
            out._backward = lambda: rule(x, out)
            return out

        return softplus

    def correct(x, out):
        x.grad += 1 / (1 + math.exp(-x.data)) * out.grad

    def overwrites(x, out):
        x.grad = 1 / (1 + math.exp(-x.data)) * out.grad

    assert mastery.check_backward_rule(make(correct))
    failures = mastery.check_backward_rule(make(overwrites)).failures
    assert failures and all("softplus(x) * x + x" in f for f in failures)
    assert not mastery.check_backward_rule(lambda x: np.log1p(np.exp(x.data)))


@pytest.mark.parametrize("x0", [-3.0, -0.5, 0.0, 2.5, 7.0])
def test_the_softplus_gates_closed_form_answers_are_pytorchs(x0):
    for shape, (value, grad) in mastery.softplus_reference(x0).items():
        x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
        sp = torch.nn.functional.softplus(x)
        out = sp if shape == "softplus(x)" else sp * x + x
        out.backward()
        assert value == pytest.approx(out.item(), abs=1e-12)
        assert grad == pytest.approx(x.grad.item(), abs=1e-12)
