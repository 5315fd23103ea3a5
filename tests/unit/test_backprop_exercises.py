"""Module 4's exercises as a reader meets them: each skeleton in the notebook is told it is not
written yet, independently written answers pass, each slip a gate names is named, a wrong answer
it has no name for still fails, passes on the reader's own code (and only those) go into their
record, and the notebook goes on with the reader's code once it passes."""

import json
import math
import multiprocessing
import subprocess
import sys

import nbformat
import pytest

from posttrainllm import nn
from posttrainllm.solutions import backprop as solutions
from posttrainllm.tools import mastery, record
from tests.conftest import ROOT
from tests.exercises import exercise_cells, run_cells, run_with_answers

NOTEBOOK = ROOT / "notebooks" / "04-backprop.ipynb"
GATES = {"value": "check_value(Value)", "backward": "check_backward(backward)",
         "train_step": "check_train_step(train_step)", "backward_rule": "check_backward_rule(softplus)"}
CALLS = {**GATES, "graph_size": "check_graph_size(nodes, loss)"}

# A reader's answers, written apart from the book's (posttrainllm.autograd): the cells they type.
READER = {
    "value": '''
class Value:
    def __init__(self, data, parents=(), op=""):
        self.data, self.grad, self.parents, self.op = float(data), 0.0, parents, op
        self._backward = lambda: None

    def _node(self, data, parents, op, local):
        out = Value(data, parents, op)

        def _backward():
            for parent, derivative in zip(parents, local(out)):
                parent.grad += derivative * out.grad

        out._backward = _backward
        return out

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return self._node(self.data + other.data, (self, other), "+", lambda out: (1.0, 1.0))

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return self._node(self.data * other.data, (self, other), "*", lambda out: (other.data, self.data))

    def __pow__(self, k):
        return self._node(self.data**k, (self,), f"**{k}", lambda out: (k * self.data ** (k - 1),))

    def exp(self):
        return self._node(math.exp(self.data), (self,), "exp", lambda out: (out.data,))

    def log(self):
        return self._node(math.log(self.data), (self,), "log", lambda out: (1 / self.data,))

    def tanh(self):
        return self._node(math.tanh(self.data), (self,), "tanh", lambda out: (1 - out.data**2,))

    def __neg__(self):
        return self * -1

    def __sub__(self, other):
        return self + (-other)

    def __truediv__(self, other):
        return self * other**-1

    def __radd__(self, other):
        return self + other

    def __rmul__(self, other):
        return self * other

    def __rsub__(self, other):
        return Value(other) - self

    def __rtruediv__(self, other):
        return Value(other) / self


mastery.check_value(Value)
''',
    "backward": '''
def backward(self):
    order, listed, todo = [], set(), [(self, False)]
    while todo:
        node, parents_listed = todo.pop()
        if parents_listed:
            order.append(node)
        elif id(node) not in listed:
            listed.add(id(node))
            todo.append((node, True))
            todo.extend((parent, False) for parent in node.parents)
    for node in order:
        if node.parents:
            node.grad = 0.0
    self.grad += 1.0
    for node in order[::-1]:
        node._backward()


Value.backward = backward
mastery.check_backward(backward)
''',
    "train_step": '''
def train_step(model, X, y, lr):
    loss = nn.batch_loss(model, X, y)
    for p in model.parameters():
        p.grad = 0.0
    loss.backward()
    for p in model.parameters():
        p.data = p.data - lr * p.grad
    return float(loss.data)


mastery.check_train_step(train_step)
''',
    "graph_size": '''
loss = nn.batch_loss(net, X_small, y_small)
seen, todo = set(), [loss]
while todo:
    node = todo.pop()
    if id(node) not in seen:
        seen.add(id(node))
        todo.extend(node.parents)
nodes = len(seen)

mastery.check_graph_size(nodes, loss)
''',
    "backward_rule": '''
def softplus(x):
    out = type(x)(math.log1p(math.exp(x.data)), parents=(x,), op="softplus")

    def _backward():
        x.grad += out.grad * math.exp(x.data) / (1 + math.exp(x.data))

    out._backward = _backward
    return out


mastery.check_backward_rule(softplus)
''',
}


def _run(sources: list[str], **names) -> dict:
    return run_cells(sources, math=math, nn=nn, **names)


def _gate(gate: str, namespace: dict) -> mastery.GateResult:
    return eval(f"mastery.{GATES[gate]}", namespace)  # noqa: S307 - the call the notebook makes


def test_every_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = exercise_cells(nb, CALLS)
    assert set(cells) == set(CALLS)
    namespace = _run([nb.cells[cells["value"]].source, nb.cells[cells["backward"]].source,
                      nb.cells[cells["train_step"]].source, nb.cells[cells["backward_rule"]].source])
    for gate in GATES:
        result = _gate(gate, namespace)
        assert not result and result.first == mastery.FIRST[gate], gate
        assert repr(result).startswith(f"NOT YET {result.gate}: not written yet") and "Start here:" in repr(result)
        assert mastery.yours(gate, namespace[GATES[gate].split("(")[1][:-1]], "book's") == "book's"
        # and the stored output of that cell says so
        stored = "".join(o.get("data", {}).get("text/plain", "") for o in nb.cells[cells[gate]].outputs)
        assert stored == repr(result), gate


def test_a_readers_own_answers_pass_and_the_notebook_goes_on_with_them(capsys):
    namespace = _run([READER["value"], READER["backward"], READER["train_step"], READER["backward_rule"]])
    for gate in GATES:
        assert _gate(gate, namespace), f"{gate}: {_gate(gate, namespace)!r}"
    assert mastery.yours("Value", namespace["Value"], solutions.Value) is namespace["Value"]
    assert "Your Value passed its gate: the cells below run yours." in capsys.readouterr().out
    # the reader's class trains the package's MLP, to the book's engine's numbers
    theirs = nn.MLP([2, 4, 2], seed=3, value=namespace["Value"])
    books = nn.MLP([2, 4, 2], seed=3)
    X, y = [[0.5, -1.0], [1.5, 0.25], [-0.3, 0.8]], [0, 1, 1]
    for _ in range(3):
        mine, book = namespace["train_step"](theirs, X, y, 0.3), solutions.train_step(books, X, y, 0.3)
        assert math.isclose(mine, book, rel_tol=1e-12)


VALUE_SLIPS = [
    ("parent.grad += derivative * out.grad", "parent.grad = derivative * out.grad", "never assign (=)"),
    ("lambda out: (other.data, self.data))", "lambda out: (self.data, other.data))", "the *other* factor"),
    ("(k * self.data ** (k - 1),)", "(self.data ** (k - 1),)", "keep the factor k"),
    ("(k * self.data ** (k - 1),)", "(k * self.data ** k,)", "lower the power by one"),
    ('"exp", lambda out: (out.data,)', '"exp", lambda out: (self.data,)', "e**x itself"),
    ("(1 - out.data**2,)", "(1 - self.data**2,)", "square the output, not the input"),
    ("return self._node(self.data + other.data, (self, other)", "return self._node(self.data + other.data, ()",
     "pass the inputs as parents"),
]
BACKWARD_SLIPS = [
    ("for node in order[::-1]:", "for node in order:", "reverse the topological order"),
    ("elif id(node) not in listed:", "elif True:", "keep a set of the nodes already visited"),
    ("        if node.parents:\n            node.grad = 0.0", "        pass", "reset each intermediate node's grad"),
    ("        if node.parents:\n            node.grad = 0.0", "        node.grad = 0.0", "leaves accumulate"),
    ("self.grad += 1.0", "pass", "nothing started the sweep"),
]


@pytest.mark.parametrize(("old", "new", "named"), VALUE_SLIPS, ids=[s[2] for s in VALUE_SLIPS])
def test_each_slip_in_value_is_named(old, new, named):
    result = mastery.check_value(_run([READER["value"].replace(old, new)])["Value"])
    assert not result and named in repr(result), repr(result)


@pytest.mark.parametrize(("old", "new", "named"), BACKWARD_SLIPS, ids=[s[2] for s in BACKWARD_SLIPS])
def test_each_slip_in_backward_is_named(old, new, named):
    result = mastery.check_backward(_run([READER["value"], READER["backward"].replace(old, new)])["backward"])
    assert not result and named in repr(result), repr(result)


def test_a_recursive_backward_is_told_to_keep_its_own_stack():
    recursive = '''
def backward(self):
    order, seen = [], set()
    def visit(node):
        if id(node) not in seen:
            seen.add(id(node))
            for parent in node.parents:
                visit(parent)
            order.append(node)
    visit(self)
    for node in order:
        if node.parents:
            node.grad = 0.0
    self.grad += 1.0
    for node in reversed(order):
        node._backward()
'''
    result = mastery.check_backward(_run([recursive])["backward"])
    assert not result and len(result.failures) == 1 and "keep your own stack" in repr(result)


@pytest.mark.parametrize("gate", ["value", "backward", "backward_rule", "train_step"])
def test_a_wrong_answer_the_gate_has_no_name_for_still_fails(gate):
    wrong = {
        "value": ('"exp", lambda out: (out.data,)', '"exp", lambda out: (2 * out.data,)'),
        "backward": ("self.grad += 1.0", "self.grad += 2.0"),
        "backward_rule": ("x.grad += out.grad", "x.grad += 0.5 * out.grad"),
        "train_step": ("p.data - lr * p.grad", "p.data - 0.5 * lr * p.grad"),
    }[gate]
    sources = [READER["value"], READER["backward"]]
    if gate == "value":
        sources[0] = sources[0].replace(*wrong)
    elif gate == "backward":
        sources[1] = sources[1].replace(*wrong)
    else:
        sources.append(READER[gate].replace(*wrong))
    result = _gate(gate, _run(sources))
    assert not result and not result.first and " -- " not in repr(result), repr(result)


def test_a_sum_whose_number_lies_about_equality_does_not_pass():
    class Liar(float):  # a float that says it equals anything
        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

    class Anything:  # not a number at all, equal to anything
        def __init__(self, data):
            self.data = data

        def __eq__(self, other):
            return True

    for lying in (Liar, Anything):
        wrong_sum = READER["value"].replace("self._node(self.data + other.data,", "self._node(lying(self.data + 1),")
        namespace = _run([wrong_sum.replace("float(data)", "data")], lying=lying)
        result = mastery.check_value(namespace["Value"])
        assert not result and any(f.startswith("a + b at") for f in result.failures), repr(result)


def test_passes_on_the_readers_own_code_and_only_those_go_into_the_record():
    assert mastery.check_value(solutions.Value) and mastery.check_backward(solutions.backward)
    loss = solutions.Value(1.0) * 2 + 1
    assert mastery.check_graph_size(solutions.graph_size(loss), loss, record=False)
    assert record.load() == set() and not record.path().exists()
    _run([READER["value"]])  # the reader's cell ends with its gate, as in the notebook
    assert record.load() == {"value"}
    assert mastery.progress(4).startswith("Module 4: 1 of 5 gates passed (value); not yet: backward,")
    namespace = _run([READER["value"], READER["backward"]])
    assert mastery.check_backward(namespace["backward"]) and record.load() == {"value", "backward"}


def test_a_damaged_record_is_named_kept_and_does_not_stop_the_gate(capsys):
    record.path().write_text("{not json", encoding="utf-8")
    namespace = _run([READER["value"]])
    assert mastery.check_value(namespace["Value"])
    assert "your pass was not recorded: cannot read your record" in capsys.readouterr().err
    assert record.path().read_text(encoding="utf-8") == "{not json"
    assert mastery.progress(4).startswith(f"cannot read your record of passed gates in {record.path()}")
    run = subprocess.run([sys.executable, "-m", "posttrainllm", "progress"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == "" and "move the file aside" in run.stderr


def _mark_many(prefix: str, path: str) -> None:
    for i in range(25):
        record.mark(f"{prefix}{i}", path)


def test_two_notebooks_recording_at_once_keep_every_pass(tmp_path):
    path = tmp_path / "progress.json"
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=_mark_many, args=(prefix, str(path))) for prefix in "ab"]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    assert record.load(path) == {f"{p}{i}" for p in "ab" for i in range(25)}
    assert json.loads(path.read_text())["version"] == 1


def test_progress_lists_every_module_on_the_command_line():
    record.mark("value")
    run = subprocess.run([sys.executable, "-m", "posttrainllm", "progress"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"the gates you have passed, from {record.path()}:"
    assert len([line for line in lines if line.startswith("Module ")]) == 10
    assert ("Module 10: 0 of 7 gates passed; not yet: sae_step, verify, expected_tokens, alpha_for, "
            "group_advantages, grpo_loss, mcnemar_p") in lines
    assert "Module 4: 1 of 5 gates passed (value); not yet: backward, backward_rule, train_step, graph_size" in lines
    assert lines[-1] == "1 passed in all"


@pytest.mark.slow
@pytest.mark.serial
def test_the_notebook_runs_the_readers_code_once_it_passes():
    everything = run_with_answers(NOTEBOOK, READER, CALLS)
    for name in ("backward", "Value", "train_step"):
        assert f"Your {name} passed its gate: the cells below run yours." in everything
    assert "parameters, made of __main__.Value" in everything
    assert "Module 4: 5 of 5 gates passed (value, backward, backward_rule, train_step, graph_size); all done" in (
        everything)
