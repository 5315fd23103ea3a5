"""Mastery gates: each notebook's exercise calls one of these with the learner's function.

A gate runs the function on a handful of cases, compares it with the package's reference, and
says precisely which case failed and how — like a patient teaching assistant, not an assert.
It never raises: the result prints as a report and is truthy only when every case passed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from posttrainllm.tools import record as progress_record


@dataclass
class GateResult:
    gate: str
    failures: list[str] = field(default_factory=list)
    cases: int = 0
    first: str = ""  # set when the answer is still the skeleton: what to write first
    books: bool = False  # the book's own answer (a gate called with record=False), not the reader's

    @property
    def passed(self) -> bool:
        return not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        if self.first:
            return f"NOT YET {self.gate}: not written yet (it raises NotImplementedError). Start here: {self.first}"
        if self.cases == 1:  # a find-out gate: one number
            whose = "the book's" if self.books else "your"
            return f"PASSED {self.gate}: {whose} answer matches." if self.passed else "\n".join(
                [f"NOT YET {self.gate}:", *(f"  - {f}" for f in self.failures)])
        if self.passed:
            return f"PASSED {self.gate}: all {self.cases} cases match the reference."
        head = f"NOT YET {self.gate}: {len(self.failures)} of {self.cases} cases fail."
        return "\n".join([head, *(f"  - {f}" for f in self.failures)])


def _fmt(values) -> str:
    return np.array2string(np.asarray(values, dtype=float), precision=4, suppress_small=True)


def _call(fn: Callable, *args):
    """Run the learner's function; an exception becomes a message, not a crash. What it returns is
    made plain first (:func:`plain`), so the comparisons below are the gate's, not the answer's."""
    try:
        return plain(fn(*args)), None
    except Exception as err:  # noqa: BLE001 - any learner error is reported, not raised
        return None, f"raised {type(err).__name__}: {err}"


def plain(value):
    """``value`` as the built-in types the gates compare: numbers as ``int``/``float``/``bool``,
    arrays and tensors as plain ``ndarray``/``Tensor`` (a subclass could report another shape, or
    an ``__array_function__`` claim that ``allclose`` holds), tuples and lists element by element.
    Anything else is returned as it is, and the gate's type checks refuse it."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return np.array(value, subok=False)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.as_subclass(torch.Tensor).detach().clone()
    if hasattr(type(value), "__array__") or hasattr(type(value), "__array_function__"):
        return np.asarray(value)  # an array-like: its data, and numpy's own comparisons of it
    return value


def _show(value) -> str:
    """A number as the reports print it; anything else as its repr."""
    number = _number(value)
    return f"{number:.6f}" if number is not None else repr(value)


def _number(value) -> float | None:
    """``value`` as a float when it is a plain number (or a 0-d numeric array), else ``None``."""
    if isinstance(value, np.ndarray) and value.shape == () and np.issubdtype(value.dtype, np.number):
        return float(value)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def check_fit_line(fit_line: Callable[[np.ndarray, np.ndarray], tuple[float, float]]) -> GateResult:
    """Gate for module 1: ``fit_line(x, y) -> (w, b)``, the least-squares line in closed form."""
    from posttrainllm import linear

    result = GateResult("fit_line")
    noisy = linear.make_line_data(n=30, slope=1.5, intercept=0.5, seed=11)
    falling = linear.make_line_data(n=25, slope=-0.5, intercept=4.0, noise=0.3, seed=12)
    exact = (np.array([0.0, 1.0, 2.0, 3.0]), np.array([-2.0, 1.0, 4.0, 7.0]))
    for label, (x, y) in [("noisy points", noisy), ("a falling line", falling), ("an exact line", exact)]:
        result.cases += 1
        got, err = _call(fit_line, x.copy(), y.copy())
        want = linear.fit_closed_form(x, y)
        if err:
            result.failures.append(f"{label}: {err}")
        elif got is None or np.shape(got) != (2,):
            result.failures.append(f"{label}: expected a pair (w, b), got {got!r}")
        elif not np.allclose(got, want, rtol=1e-6, atol=1e-9):
            result.failures.append(f"{label}: expected (w, b) = {_fmt(want)}, got {_fmt(got)}")
    result.cases += 1
    got, err = _call(fit_line, np.full(5, 2.0), np.arange(5.0))
    if err is None or not err.startswith("raised ValueError"):
        result.failures.append(
            "all x equal: the slope is undetermined, so raise ValueError "
            f"(got {'a result ' + repr(got) if err is None else err})"
        )
    return result


def check_numerical_gradient(numerical_gradient: Callable) -> GateResult:
    """Gate for module 2: ``numerical_gradient(f, theta) -> array``, by central differences."""
    from posttrainllm import linear

    result = GateResult("numerical_gradient")
    x, y = linear.make_line_data(n=20, seed=21)
    cases = [
        ("f(t) = t.t", lambda t: float(t @ t), np.array([1.0, -2.0, 3.0]), lambda t: 2 * t),
        ("f(t) = sum(exp(t))", lambda t: float(np.exp(t).sum()), np.array([0.5, -1.0]), np.exp),
        (
            "the MSE of a line",
            lambda t: linear.mse_loss(t, x, y),
            np.array([0.3, -0.7]),
            lambda t: linear.mse_grad(t, x, y),
        ),
    ]
    for label, f, theta, exact in cases:
        result.cases += 1
        before = theta.copy()
        got, err = _call(numerical_gradient, f, theta)
        want = exact(before)
        if err:
            result.failures.append(f"{label}: {err}")
            continue
        if not np.array_equal(theta, before):
            result.failures.append(f"{label}: theta was changed in place; perturb a copy")
            continue
        got = np.asarray(got, dtype=float) if got is not None else None
        if got is None or got.shape != want.shape:
            shape = None if got is None else got.shape
            result.failures.append(f"{label}: expected shape {want.shape}, got {shape}")
            continue
        error = float(np.max(np.abs(got - want)))
        if error > 1e-7:
            hint = (
                " -- that size of error is typical of a one-sided difference; "
                "use (f(t + eps) - f(t - eps)) / (2 eps)"
                if error < 1e-3
                else ""
            )
            result.failures.append(
                f"{label}: expected {_fmt(want)}, got {_fmt(got)} (max error {error:.1e}){hint}"
            )
    return result


def check_tiled_reads(tiled_reads: Callable[[int, int, int, int], int]) -> GateResult:
    """Gate for module 3: ``tiled_reads(m, n, k, tile)``, slow-memory loads of a tiled matmul.

    The reference is the count that :func:`posttrainllm.matmul.matmul_tiled` makes while it
    really computes the product, so a formula that is right only for square or evenly divisible
    shapes fails on the ragged cases.
    """
    from posttrainllm import matmul

    result = GateResult("tiled_reads")
    rng = np.random.default_rng(31)
    for m, n, k, tile in [(64, 64, 64, 16), (32, 96, 48, 16), (50, 30, 70, 16), (17, 5, 9, 4)]:
        result.cases += 1
        _, traffic = matmul.matmul_tiled(rng.standard_normal((m, k)), rng.standard_normal((k, n)), tile)
        got, err = _call(tiled_reads, m, n, k, tile)
        label = f"m={m}, n={n}, k={k}, tile={tile}"
        if err:
            result.failures.append(f"{label}: {err}")
        elif type(got) is not int:  # plain() made every kind of integer an int
            result.failures.append(f"{label}: expected a whole number of loads, got {type(got).__name__}")
        elif got != traffic.slow_reads:
            even = (m % tile, n % tile) == (0, 0)
            hint = "" if even else " (tiles at the edges are partial: count them with a ceiling)"
            result.failures.append(f"{label}: the kernel loaded {traffic.slow_reads} numbers, you said {got}{hint}")
    return result


def softplus_reference(x0: float) -> dict[str, tuple[float, float]]:
    """The gate's answers at ``x0``, in closed form: (value, d/dx) of each expression it tries.
    softplus(x) = log(1 + e^x), and its derivative is the sigmoid 1 / (1 + e^-x)."""
    sp, sig = math.log1p(math.exp(x0)), 1 / (1 + math.exp(-x0))
    return {"softplus(x)": (sp, sig), "softplus(x) * x + x": (sp * x0 + x0, sig * x0 + sp + 1)}


def _is_node(value) -> bool:
    """Has what the backward pass needs: a value, a gradient, its parents and a local rule."""
    return all(hasattr(value, a) for a in ("data", "grad", "parents", "_backward"))


def _backprop(root) -> None:
    """The package's backward pass, run on any graph of nodes (the reader's class or the book's)."""
    from posttrainllm.autograd import backpropagate

    backpropagate(root, lambda node: 0.0)


def check_backward_rule(op: Callable) -> GateResult:
    """Gate for module 4: ``softplus(x: Value) -> Value``, ``log(1 + e^x)`` as a new operation with
    its own ``_backward``. Checked against :func:`softplus_reference` (which the tests check against
    PyTorch's float64 autograd), alone and inside an expression that uses ``x`` twice (which
    catches ``x.grad = ...`` where ``+=`` is needed). Pure Python, so it runs in the browser too."""
    from posttrainllm.autograd import Value

    builds = {"softplus(x)": lambda f, x: f(x), "softplus(x) * x + x": lambda f, x: f(x) * x + x}
    result = GateResult("softplus backward rule")
    for x0 in (-3.0, -0.5, 0.0, 2.5):
        for shape, (value, grad) in softplus_reference(x0).items():
            result.cases += 1
            x = Value(x0)
            out, err = _call(lambda x=x, build=builds[shape]: build(op, x))
            label = f"{shape} at x = {x0:g}"
            if not err and not _is_node(out):
                err = f"expected a Value, got {type(out).__name__}"
            if not err:
                err = _call(_backprop, out)[1]
            if err:
                result.failures.append(f"{label}: {err}")
            elif abs(out.data - value) > 1e-10:
                result.failures.append(f"{label}: forward value {out.data:.6f}, expected {value:.6f}")
            elif abs(x.grad - grad) > 1e-10:
                result.failures.append(f"{label}: d/dx = {x.grad:.6f}, the answer is {grad:.6f}")
    return result


# each case of the Value gate: what it builds from two Values a and b, and the slips it can name
# as (wrong d/da, its name) at the point (a, b)
_VALUE_CASES: dict[str, tuple[Callable, Callable[[float, float], list[tuple[float, str]]]]] = {
    "a + b": (lambda a, b: a + b, lambda a, b: [(0.0, "a sum sends out.grad to both inputs unchanged")]),
    "a * b": (lambda a, b: a * b, lambda a, b: [(a, "each factor's gradient is the *other* factor times out.grad")]),
    "a * a": (lambda a, b: a * a, lambda a, b: [(a, "a is both parents: each rule must add into .grad (+=), "
                                                   "never assign (=)")]),
    "a ** 3": (lambda a, b: a**3, lambda a, b: [(a**2, "d(x**k)/dx = k * x**(k - 1): keep the factor k"),
                                               (3 * a**3, "d(x**k)/dx = k * x**(k - 1): lower the power by one")]),
    "b ** -0.5": (lambda a, b: b**-0.5, lambda a, b: []),
    "a.exp()": (lambda a, b: a.exp(), lambda a, b: [(a, "d(e**x)/dx is e**x itself: out.data")]),
    "b.log()": (lambda a, b: b.log(), lambda a, b: []),
    "a.tanh()": (lambda a, b: a.tanh(), lambda a, b: [(1 - a * a, "d tanh(x)/dx = 1 - tanh(x)**2: square the "
                                                                  "output, not the input")]),
    "(a + 2) * (3 * a) - 1 / b": (lambda a, b: (a + 2) * (3 * a) - 1 / b, lambda a, b: []),
    "((a * b).exp() + b ** 2).log() - a / b": (lambda a, b: ((a * b).exp() + b**2).log() - a / b,
                                               lambda a, b: []),
}
_VALUE_SLIP_INPUTS = {"b.log()": "b", "b ** -0.5": "b"}  # the cases whose slips concern b, not a


def check_value(value_class: type) -> GateResult:
    """Gate for module 4: the ``Value`` class: ``Value(data)`` holds a number with ``grad = 0``, and
    ``+``, ``*``, ``** k`` (a number ``k``), ``exp()``, ``log()`` and ``tanh()`` each return a new
    ``Value`` whose ``parents`` are its inputs and whose ``_backward`` adds the local derivative
    times ``out.grad`` into each parent's ``grad``. Each expression is built from the reader's
    class, swept backwards by the book's own backward pass, and compared with the book's ``Value``
    at two points; plain numbers on either side of an operator are included."""
    from posttrainllm.autograd import Value

    result = GateResult("Value")
    for a0, b0 in ((0.7, 1.3), (-1.2, 0.4)):
        for label, (build, slips) in _VALUE_CASES.items():
            result.cases += 1
            label = f"{label} at a = {a0:g}, b = {b0:g}"
            want_a, want_b = Value(a0), Value(b0)
            want = build(want_a, want_b)
            want.backward()
            made, err = _call(lambda a0=a0, b0=b0: (value_class(a0), value_class(b0)))
            out, err = (None, err) if err else _call(build, *made)
            if not err and not _is_node(out):
                err = f"expected a Value (data, grad, parents, _backward), got {type(out).__name__}"
            if err:
                result.failures.append(f"{label}: {err}")
                continue
            a, b = made
            got = _number(out.data)
            if got is None or not math.isclose(got, want.data, rel_tol=1e-12, abs_tol=1e-12):
                result.failures.append(f"{label}: forward value {out.data!r}, expected {want.data:.6f}")
                continue
            if not out.parents:
                result.failures.append(f"{label}: the result has no parents, so no gradient can reach a or b -- "
                                       "pass the inputs as parents")
                continue
            err = _call(_backprop, out)[1]
            if err:
                result.failures.append(f"{label}: the backward pass {err}")
                continue
            grads = _number(a.grad), _number(b.grad)
            if None in grads or not all(math.isclose(g, w.grad, rel_tol=1e-10, abs_tol=1e-12)
                                        for g, w in zip(grads, (want_a, want_b), strict=True)):
                name = "b" if _VALUE_SLIP_INPUTS.get(label.split(" at ")[0]) else "a"
                got_grad = grads[name == "b"]
                hint = next((h for wrong, h in slips(a0, b0) if got_grad is not None and
                             math.isclose(got_grad, wrong, rel_tol=1e-10, abs_tol=1e-12)), None)
                if hint is None and grads == (0.0, 0.0):
                    hint = "no gradient arrived: set out._backward to the rule, and add into the parents' .grad"
                result.failures.append(f"{label}: d/da, d/db = {_show(a.grad)}, {_show(b.grad)}; expected "
                                       f"{want_a.grad:.6f}, {want_b.grad:.6f}" + (f" -- {hint}" if hint else ""))
    return result


def _sweep(root, reverse: bool = True, once: bool = True, reset: bool = True) -> None:
    """A backward pass with one step left out or done wrong: the slips :func:`check_backward` names."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif not once or id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in node.parents)
    for node in order:
        if reset and node.parents:
            node.grad = 0.0
    root.grad += 1.0
    for node in reversed(order) if reverse else order:
        node._backward()


def _backward_graphs():
    """``(label, build, calls)``: each builds a fresh graph of the book's Values and returns
    ``(root, leaves)``; the reader's backward runs ``calls`` times on it."""
    from posttrainllm.autograd import Value

    def tiny():
        a, b = Value(2.0), Value(-3.0)
        return (a * b + a).tanh(), (a, b)

    def shared():
        p, q = Value(0.7), Value(-1.3)
        s = p * q + p.exp() / (1 + q * q)
        return (s * s + 1).log() - s.tanh() * (p - q) ** 2, (p, q)

    def chain():
        x = out = Value(1.0)
        for _ in range(20_000):
            out = out * 1.0001
        return out, (x,)

    def leaf():
        a = Value(3.0)
        return a, (a,)

    return [("tanh(a*b + a)", tiny, 1), ("a graph with a shared sub-expression", shared, 1),
            ("tanh(a*b + a), backward() called twice", tiny, 2), ("a chain 20,000 operations deep", chain, 1),
            ("a lone leaf", leaf, 1)]


def _all_close(got: list, want: list) -> bool:
    return len(got) == len(want) and all(g is not None and math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-12)
                                         for g, w in zip(got, want, strict=True))


def check_backward(backward: Callable) -> GateResult:
    """Gate for module 4: ``backward(self)``, the method that fills ``grad`` of every node the output
    ``self`` depends on: list the nodes in topological order (each after its parents) without
    recursion, reset the gradients of the nodes that have parents to 0, add 1 to ``self.grad``, and
    run each node's ``_backward`` from the output back to the inputs. Leaves keep what they had, so a
    second call adds the same gradients again (as in PyTorch). Run on graphs of the book's
    ``Value``, so only the sweep is checked: a shared sub-expression, a second call, a chain 20,000
    deep and an output that is itself a leaf."""
    result = GateResult("backward")
    slips = {
        "run the rules from the output back to the inputs: reverse the topological order": {"reverse": False},
        "a node reached by two paths ran its rule twice: keep a set of the nodes already visited": {"once": False},
        "the first call's gradients flowed again: reset each intermediate node's grad to 0 first": {"reset": False},
    }
    for label, build, calls in _backward_graphs():
        result.cases += 1
        root, leaves = build()
        want_root, want_leaves = build()
        for _ in range(calls):
            _backprop(want_root)
        err = None
        for _ in range(calls):
            err = err or _call(backward, root)[1]
        if err:
            hint = " -- a recursive walk runs out of Python's stack here: keep your own stack (a list)" if (
                "RecursionError" in err) else ""
            result.failures.append(f"{label}: {err}{hint}")
            continue
        got = [_number(leaf.grad) for leaf in leaves]
        want = [leaf.grad for leaf in want_leaves]
        if _all_close(got, want):
            continue
        hint = ""
        if _number(root.grad) == 0.0:
            hint = " -- nothing started the sweep: add 1 to the output's own grad (d out / d out) first"
        elif calls == 2 and _all_close([2 * g for g in got if g is not None], want):
            hint = " -- leaves accumulate: a second call adds the same gradients again, so do not reset the leaves"
        for name, wrong in slips.items() if None not in got else ():
            variant_root, variant_leaves = build()
            with contextlib.suppress(RecursionError):
                for _ in range(calls):
                    _sweep(variant_root, **wrong)
                if not hint and _all_close(got, [v.grad for v in variant_leaves]):
                    hint = f" -- {name}"
        result.failures.append(f"{label}: input gradients {_fmt([g if g is not None else np.nan for g in got])}, "
                               f"expected {_fmt(want)}{hint}")
    return result


def check_top_p(top_p_distribution: Callable[[np.ndarray, float], np.ndarray]) -> GateResult:
    """Gate for module 5: ``top_p_distribution(probs, p)``, the renormalised nucleus distribution.

    Reference: :func:`posttrainllm.sampling.next_token_distribution` with ``top_p=p``. Cases cover
    the boundary (mass exactly reaching p), p = 1, a tiny p, and ties (lower ids win).
    """
    from posttrainllm.sampling import next_token_distribution

    result = GateResult("top_p_distribution")
    cases = [
        ([0.5, 0.3, 0.15, 0.05], 0.8, "mass reaches p exactly at the second token"),
        ([0.5, 0.3, 0.15, 0.05], 0.81, "just past the second token"),
        ([0.1, 0.6, 0.3], 1.0, "p = 1 keeps everything"),
        ([0.1, 0.6, 0.3], 0.01, "a tiny p keeps only the most likely token"),
        ([0.25, 0.25, 0.25, 0.25], 0.5, "ties: the lower ids are kept"),
    ]
    for probs, p, label in cases:
        result.cases += 1
        probs = np.array(probs)
        want = next_token_distribution(np.log(probs), top_p=p)
        got, err = _call(top_p_distribution, probs.copy(), p)
        if err:
            result.failures.append(f"{label} (p={p}): {err}")
        elif got is None or np.shape(got) != want.shape:
            result.failures.append(f"{label} (p={p}): expected an array of shape {want.shape}, got {got!r}")
        elif not np.allclose(got, want, atol=1e-9):
            unnormalised = np.isclose(np.sum(got), p) and not np.isclose(np.sum(got), 1)
            hint = " -- did you renormalise the kept mass to 1?" if unnormalised else ""
            result.failures.append(f"{label} (p={p}): expected {_fmt(want)}, got {_fmt(got)}{hint}")
    return result


def _bpe_slip(word_counts: dict, vocab_size: int, weighted: bool = True, largest_tie: bool = False,
              right_to_left: bool = False) -> list[tuple[int, int]]:
    """The textbook BPE loop with one slip: unweighted counts, ties to the largest pair, or merges
    made from the right (``"aaa"`` -> ``a, aa``). The gate's reference is the package's trainer."""
    words = {tuple(w): n for w, n in word_counts.items()}
    merges = []
    for new_id in range(256, vocab_size):
        counts: dict = {}
        for word, n in words.items():
            for pair in zip(word, word[1:]):  # noqa: B905 - consecutive ids
                counts[pair] = counts.get(pair, 0) + (n if weighted else 1)
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], p)) if largest_tie else min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        words = {_merge_from(w, pair, new_id, right_to_left): n for w, n in words.items()}
    return merges


def _merge_from(word: tuple, pair: tuple, new_id: int, right_to_left: bool) -> tuple:
    from posttrainllm.tokenizer import merge_pair

    if not right_to_left:
        return tuple(merge_pair(list(word), pair, new_id))
    return tuple(reversed(merge_pair(list(reversed(word)), pair[::-1], new_id)))


def _vocabulary(merges: list) -> dict[int, bytes]:
    vocab = {i: bytes([i]) for i in range(256)}
    for i, (a, b) in enumerate(merges):
        vocab[256 + i] = vocab[a] + vocab[b]
    return vocab


def check_train_bpe(train_bpe: Callable) -> GateResult:
    """Gate for module 6: ``train_bpe(word_counts, vocab_size) -> (merges, vocab)``, byte-pair
    encoding trained from scratch. ``word_counts`` maps each pre-token's bytes to its count (as
    ``bpe.count_words`` gives them). Each step counts every adjacent pair inside every pre-token,
    weighted by its count, merges the most frequent (ties: the smallest pair) into id ``256 + step``
    everywhere, left to right without overlaps, and stops at ``vocab_size`` or when no pair is
    left. ``merges`` lists the pairs in order; ``vocab`` maps every id to its bytes. Reference: the
    package's incremental trainer, on hand-made counts and on the book's stories."""
    from collections import Counter

    from posttrainllm import data
    from posttrainllm.tokenizer import count_words, train_merges

    result = GateResult("train_bpe")
    cases = [
        ("three words", count_words("the cat the hat the mat"), 262),
        ("counts weighted by how often a pre-token occurs", Counter({b"abc": 1, b"bc": 5, b"ab": 2}), 258),
        ("a tie: the smallest pair wins", Counter({b"ef": 2, b"cd": 2}), 257),
        ("runs of one letter merge from the left", Counter({b"aaaa": 3, b"aaa": 2, b"ba": 1}), 259),
        ("fewer pairs than the vocabulary asks for: stop when none is left", Counter({b"ab": 1, b"c": 4}), 300),
        ("accented letters, CJK and an emoji", count_words("na\u00efve caf\u00e9 \u65e5\u672c \U0001f98a " * 3), 280),
        ("the book's stories (20,000 characters)", count_words(data.corpus(n_chars=20_000, seed=3)), 330),
    ]
    slips = {"count each pair once per occurrence of its pre-token: add the pre-token's count": {"weighted": False},
             "on a tie, merge the smallest pair": {"largest_tie": True},
             "merge left to right: in 'aaa' the first two letters join": {"right_to_left": True}}
    for label, word_counts, vocab_size in cases:
        result.cases += 1
        want = train_merges(Counter(word_counts), vocab_size)
        got, err = _call(train_bpe, Counter(word_counts), vocab_size)
        if err:
            hint = " -- stop when no pair is left" if "empty" in err and "stop" in label else ""
            result.failures.append(f"{label}: {err}{hint}")
            continue
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict)):
            result.failures.append(f"{label}: expected (merges, vocab), got {type(got).__name__}")
            continue
        merges = [tuple(m) if isinstance(m, list | tuple) else m for m in got[0]]
        if merges != want:
            first = next((i for i, (g, w) in enumerate(zip(merges, want)) if g != w), min(len(merges), len(want)))  # noqa: B905
            hint = _named_slip(merges, {h: _bpe_slip(word_counts, vocab_size, **v) for h, v in slips.items()},
                               lambda a, b: a == b)
            result.failures.append(f"{label}: {len(merges)} merges, expected {len(want)}; the first that differs "
                                   f"is merge {first}" + (f": {merges[first]} instead of {want[first]}"
                                                          if first < min(len(merges), len(want)) else "") + hint)
            continue
        vocab = _vocabulary(want)
        wrong = next((i for i in vocab if got[1].get(i) != vocab[i]), None)
        if wrong is not None or len(got[1]) != len(vocab):
            where = f"vocab[{wrong}] is {got[1].get(wrong)!r}, expected {vocab[wrong]!r}" if wrong is not None else (
                f"{len(got[1])} ids in vocab, expected {len(vocab)}")
            result.failures.append(f"{label}: {where} -- bytes 0-255 first, then each merge's two tokens' bytes joined")
    return result


def check_online_softmax_update(update: Callable[[float, float, float], tuple[float, float]]) -> GateResult:
    """Gate for module 7: ``update(peak, total, value) -> (peak, total)``, the online-softmax step.

    Folded over a sequence from ``(-inf, 0)``, it must end at ``(max(x), sum(exp(x - max(x))))``;
    the cases include a rising sequence, where forgetting to rescale the running sum shows.
    """
    result = GateResult("online_softmax_update")
    cases = [
        ("a falling sequence", np.array([3.0, 1.0, -2.0, 0.5])),
        ("a rising sequence (the max changes every step)", np.array([-1.0, 0.0, 2.0, 5.0])),
        ("large values that overflow exp()", np.array([800.0, 805.0, 790.0])),
        ("a single value", np.array([0.25])),
    ]
    for label, x in cases:
        result.cases += 1
        peak, total, err = -np.inf, 0.0, None
        for value in x:
            got, err = _call(update, peak, total, float(value))
            pair = [_number(v) for v in got] if isinstance(got, tuple | list) and len(got) == 2 else [None]
            if err is None and None in pair:
                err = f"expected a pair (peak, total) of numbers, got {got!r}"
            if err:
                break
            peak, total = pair
        if err:
            result.failures.append(f"{label}: {err}")
            continue
        want_peak = float(x.max())
        want_total = float(np.exp(x - want_peak).sum())
        if not (np.isclose(peak, want_peak) and np.isclose(total, want_total, rtol=1e-9)):
            # the usual slip: each term against the max of its own time, the sum never rescaled
            stale = float(np.exp(x - np.maximum.accumulate(x)).sum())
            hint = " -- rescale the running sum by exp(old max - new max)" if (
                np.isclose(peak, want_peak) and np.isclose(total, stale, rtol=1e-9)) else ""
            result.failures.append(
                f"{label}: ended at (max {peak:.4g}, sum {total:.6g}), "
                f"expected ({want_peak:.4g}, {want_total:.6g}){hint}"
            )
    return result


def check_adamw_update(update: Callable) -> GateResult:
    """Gate for module 8: ``adamw_update(w, g, m, v, t, lr, betas, eps, weight_decay) -> (w, m, v)``,
    one AdamW step, compared with ``torch.optim.AdamW`` run on the same gradients.

    The cases separate the usual slips: no bias correction (wrong on the first steps), weight
    decay through the gradient (Adam's L2, not AdamW's), and decay missing altogether.
    """
    import torch

    result = GateResult("adamw_update")
    rng = np.random.default_rng(8)
    cases = [
        ("the first step (bias correction matters most here)", 1, 0.0),
        ("five steps without weight decay", 5, 0.0),
        ("five steps with weight decay 0.1 (decoupled from the gradient)", 5, 0.1),
        ("gradients of very different sizes per weight", 5, 0.1),
    ]
    for label, steps, wd in cases:
        result.cases += 1
        w0 = rng.standard_normal(6)
        scale = np.array([1e-3, 1e-2, 1.0, 1.0, 10.0, 100.0]) if "sizes" in label else np.ones(6)
        grads = rng.standard_normal((steps, 6)) * scale
        p = torch.tensor(w0, requires_grad=True)
        reference = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
        w, m, v = w0.copy(), np.zeros(6), np.zeros(6)
        error = None
        for t, g in enumerate(grads, start=1):
            p.grad = torch.tensor(g)
            reference.step()
            out, error = _call(update, w, g.copy(), m, v, t, 0.01, (0.9, 0.999), 1e-8, wd)
            if error:
                break
            w, m, v = (np.asarray(a, dtype=float) for a in out)
        want = p.detach().numpy()
        if error:
            result.failures.append(f"{label}: {error}")
        elif not np.allclose(w, want, rtol=0, atol=1e-9):
            result.failures.append(f"{label}: weights {_fmt(w)}, expected {_fmt(want)}")
    return result


def _schedule_slip(step: int, max_lr: float, warmup: int, total: int, min_lr: float, slip: str) -> float:
    """The warmup + cosine schedule with one usual mistake (``slip``), for the gate's hints."""
    if step < warmup:
        return max_lr * (step if slip == "from zero" else step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    if slip == "full cosine":
        return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(2 * math.pi * progress))
    if slip == "no floor":
        return 0.5 * max_lr * (1 + math.cos(math.pi * progress))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def check_warmup_cosine(warmup_cosine: Callable) -> GateResult:
    """Gate for module 8: ``warmup_cosine(step, max_lr, warmup, total, min_lr) -> lr``, the learning
    rate at ``step`` (counted from 0): a linear warmup to ``max_lr`` that reaches it at step
    ``warmup - 1``, a half cosine down to ``min_lr`` at step ``total``, and ``min_lr`` after. Every
    step of four schedules is compared with :func:`posttrainllm.optim.warmup_cosine`."""
    from posttrainllm.optim import warmup_cosine as reference

    result = GateResult("warmup_cosine")
    slips = {"from zero": "the warmup's first step already trains: step 0 is max_lr / warmup, step warmup - 1 "
                          "is max_lr",
             "full cosine": "half a cosine period: cos(pi * progress), which falls from max_lr to min_lr once",
             "no floor": "the cosine falls to min_lr, not to 0: min_lr + (max_lr - min_lr) * ..."}
    for label, max_lr, warmup, total, min_lr in [("warmup 10 of 100 steps, down to 1e-4", 3e-3, 10, 100, 1e-4),
                                                 ("no floor (min_lr 0)", 1.0, 4, 20, 0.0),
                                                 ("a one-step warmup", 0.5, 1, 8, 0.05),
                                                 ("steps past the end stay at the floor", 2e-2, 5, 30, 2e-3)]:
        result.cases += 1
        steps = range(total + 5)
        want = [reference(t, max_lr, warmup, total, min_lr) for t in steps]
        got = []
        for t in steps:
            value, err = _call(warmup_cosine, t, max_lr, warmup, total, min_lr)
            if err or _number(value) is None:
                got = None
                result.failures.append(f"{label}, step {t}: {err or f'expected a number, got {value!r}'}")
                break
            got.append(_number(value))
        if got is None or np.allclose(got, want, rtol=1e-9, atol=1e-15):
            continue
        first = next(t for t in steps if not math.isclose(got[t], want[t], rel_tol=1e-9, abs_tol=1e-15))
        hint = _named_slip(got, {h: [_schedule_slip(t, max_lr, warmup, total, min_lr, slip) for t in steps]
                                 for slip, h in slips.items()}, lambda a, b: np.allclose(a, b, rtol=1e-9, atol=1e-15))
        result.failures.append(f"{label}: step {first} gives {got[first]:.6g}, expected {want[first]:.6g}{hint}")
    return result


def _scalar(value) -> float | None:
    """A plain number, or a one-element tensor's (a loss or a norm still in PyTorch), as a float."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return _number(value)


def _accumulate_slip(model, micro_batches, optimizer, max_norm: float, slip: str) -> tuple[float, float]:
    """One accumulated step with one usual mistake (``slip``), for the gate's hints."""
    torch = _torch()
    if slip != "no zero":
        optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        if slip == "zero each":
            optimizer.zero_grad()
        _, loss = model(x, y)
        (loss if slip == "no divide" else loss / len(micro_batches)).backward()
        losses.append(loss.item())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
    if slip == "per tensor":
        for g in grads:
            g.mul_(min(1.0, max_norm / (torch.linalg.vector_norm(g).item() + 1e-6)))
    elif slip != "no clip" and norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    optimizer.step()
    return sum(losses) / len(losses), norm


def check_accumulated_step(accumulated_step: Callable) -> GateResult:
    """Gate for module 8: ``accumulated_step(model, micro_batches, optimizer, max_norm) -> (loss,
    norm)``, one optimizer step on the gradient of all the micro-batches ``(x, y)`` together (each
    micro-batch's loss divided by their number), the gradients' global norm clipped to
    ``max_norm``; it returns the mean loss and the norm before clipping. A small GPT takes two such
    steps with SGD beside :func:`posttrainllm.train.accumulated_step`."""
    torch = _torch()
    from posttrainllm.model import GPT, GPTConfig
    from posttrainllm.optim import SGD
    from posttrainllm.train import accumulated_step as reference

    slips = {"no divide": "divide each micro-batch's loss by their number, so the summed gradients are those of "
                          "the mean loss over all the rows",
             "zero each": "zero the gradients once per step, before the first micro-batch: zeroed inside the "
                          "loop, only the last micro-batch's gradient is left",
             "no zero": "zero the gradients at the start of each step: backward adds into .grad, so the last "
                        "step's gradients were still there",
             "no clip": "clip after the last backward and before the optimizer's step, when the norm is above "
                        "max_norm",
             "per tensor": "clip by the global norm of all the gradients together, one scale for every tensor "
                           "(so the step keeps its direction)"}
    config = GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8, seed=3)

    def run(step: Callable, micro: list, max_norm: float) -> tuple[list, object, list]:
        model = GPT(config)
        optimizer = SGD(model.parameters(), lr=0.5)
        outs = []
        for batch in micro:
            out, err = _call(step, model, [(x.clone(), y.clone()) for x, y in batch], optimizer, max_norm)
            if err:
                return outs, err, []
            outs.append(out)
        return outs, None, [p.detach().clone() for p in model.parameters()]

    def run_case() -> GateResult:
        result = GateResult("accumulated_step")
        generator = torch.Generator().manual_seed(8)
        for label, count, max_norm in [("one micro-batch, no clipping", 1, 1e6),
                                       ("three micro-batches, no clipping", 3, 1e6),
                                       ("two micro-batches, clipped to a norm of 0.05", 2, 0.05),
                                       ("four micro-batches, clipped to 0.3", 4, 0.3)]:
            result.cases += 1
            rows = lambda: torch.randint(0, 11, (2, 6), generator=generator)  # noqa: E731
            micro = [[(rows(), rows()) for _ in range(count)] for _ in range(2)]  # two steps
            want, _, want_params = run(reference, micro, max_norm)
            got, err, params = run(accumulated_step, micro, max_norm)
            if err:
                result.failures.append(f"{label}, step {len(got) + 1}: {err}")
                continue
            numbers = [tuple(_scalar(x) for x in o) if isinstance(o, tuple) and len(o) == 2 else (None,) for o in got]
            odd = [o for o, pair in zip(got, numbers, strict=True) if None in pair]
            if odd:
                result.failures.append(f"{label}: expected (mean loss, norm before clipping), two numbers, "
                                       f"got {odd[0]!r}")
                continue
            close = all((a - b).abs().max().item() <= 1e-9 for a, b in zip(params, want_params, strict=True))
            if not close:
                variants = {h: run(functools.partial(_accumulate_slip, slip=slip), micro, max_norm)[2]
                            for slip, h in slips.items()}
                hint = _named_slip(params, variants, lambda a, b: bool(b) and all(
                    (x - y).abs().max().item() <= 1e-9 for x, y in zip(a, b, strict=True)))
                result.failures.append(f"{label}: the weights after two steps are not the reference's{hint}")
                continue
            for t, ((loss, norm), (want_loss, want_norm)) in enumerate(zip(numbers, want, strict=True), start=1):
                if not math.isclose(loss, want_loss, rel_tol=1e-9):
                    result.failures.append(f"{label}, step {t}: loss {loss:.6f}, expected the micro-batches' mean "
                                           f"{want_loss:.6f}")
                    break
                if not math.isclose(norm, want_norm, rel_tol=1e-6):
                    hint = (" -- return the norm measured before clipping" if
                            math.isclose(norm, min(want_norm, max_norm), rel_tol=1e-4) else "")
                    result.failures.append(f"{label}, step {t}: norm {norm:.6f}, expected {want_norm:.6f}{hint}")
                    break
        return result

    return _float64(run_case)


def check_lora_forward(lora_forward: Callable) -> GateResult:
    """Gate for module 9: ``lora_forward(x, W, b, A, B, alpha, r) -> y``, a LoRA layer's output
    ``x W^T + b + (alpha / r) x A^T B^T`` for a batch ``x`` of row vectors.

    The cases catch the usual slips: a missing ``alpha / r`` scale, A and B multiplied in the
    wrong order or untransposed, and forgetting the frozen base path.
    """
    result = GateResult("lora_forward")
    rng = np.random.default_rng(9)
    cases = [
        ("a fresh adapter (B = 0): the output is the base layer's", 4, 6, 2, 8.0, True),
        ("a trained adapter, square layer", 5, 5, 2, 4.0, False),
        ("a trained adapter, 3 inputs -> 7 outputs, alpha != r", 3, 7, 1, 16.0, False),
        ("rank 4 with alpha = r (scale 1)", 6, 4, 4, 4.0, False),
    ]
    for label, d_in, d_out, r, alpha, fresh in cases:
        result.cases += 1
        x, w, b = rng.standard_normal((3, d_in)), rng.standard_normal((d_out, d_in)), rng.standard_normal(d_out)
        a = rng.standard_normal((r, d_in))
        bb = np.zeros((d_out, r)) if fresh else rng.standard_normal((d_out, r))
        want = x @ w.T + b + (alpha / r) * (x @ a.T) @ bb.T
        got, err = _call(lora_forward, x.copy(), w.copy(), b.copy(), a.copy(), bb.copy(), alpha, r)
        if err:
            result.failures.append(f"{label}: {err}")
        elif np.shape(got) != want.shape:
            result.failures.append(f"{label}: output shape {np.shape(got)}, expected {want.shape}")
        elif not np.allclose(got, want, atol=1e-9):
            result.failures.append(f"{label}: first row {_fmt(np.asarray(got)[0])}, expected {_fmt(want[0])}")
    return result


def check_expected_tokens(expected_tokens: Callable[[float, int], float],
                          measured: dict[int, tuple[float, float]] | None = None) -> GateResult:
    """Gate for module 10: ``expected_tokens(alpha, k)``, the mean tokens per target forward of
    speculative decoding with ``k`` drafted tokens each accepted with probability ``alpha``.

    Checked against the closed form at a few points, including the edges (``alpha = 0``: one token
    per forward; ``alpha = 1``: ``k + 1``), and, when ``measured`` maps ``k`` to the notebook's
    ``(alpha, tokens per forward)``, against those runs within 10%.
    """
    from posttrainllm.speculative import expected_tokens_per_forward

    result = GateResult("expected_tokens")
    points = [(0.0, 4), (0.5, 2), (0.8, 4), (0.95, 8), (1.0, 3)]
    for alpha, k in points:
        result.cases += 1
        got, err = _call(expected_tokens, alpha, k)
        want = expected_tokens_per_forward(alpha, k)
        if err:
            result.failures.append(f"alpha={alpha}, k={k}: {err}")
        elif not np.isclose(got, want):
            hint = " -- count the bonus token: all k accepted gives k + 1" if alpha == 1.0 else ""
            result.failures.append(f"alpha={alpha}, k={k}: got {got:.4g}, expected {want:.4g}{hint}")
    for k, (alpha, tokens) in (measured or {}).items():
        result.cases += 1
        got, err = _call(expected_tokens, alpha, k)
        if err or not np.isclose(got, tokens, rtol=0.1):
            result.failures.append(f"measured run k={k} (alpha={alpha:.3f}): {tokens:.2f} tokens per forward, "
                                   f"your formula says {got if err is None else err}")
    return result


# --- module 7: the GPT, built by the reader -----------------------------------------------
# These gates compare with the package's own modules on the same weights, in float64, so a
# correct answer agrees to rounding and the tolerance (1e-5) never decides.

GPT_TOLERANCE = 1e-5


def _torch():
    import torch  # not at the top: the browser editions import this module without PyTorch

    return torch


def _compare(result: GateResult, label: str, got, want, hints: dict[str, object]) -> None:
    """One case: ``got`` against ``want``; on a miss, the first hint whose tensor ``got`` matches
    names the likely mistake."""
    torch = _torch()
    result.cases += 1
    if not isinstance(got, torch.Tensor):
        result.failures.append(f"{label}: expected a tensor of shape {tuple(want.shape)}, got {type(got).__name__}")
        return
    if got.shape != want.shape:
        result.failures.append(f"{label}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
        return
    error = (got.detach().double() - want.double()).abs().max().item()
    if error <= GPT_TOLERANCE:
        return
    hint = next((h for h, alt in hints.items() if (got.detach() - alt).abs().max().item() <= GPT_TOLERANCE), None)
    result.failures.append(f"{label}: largest difference from the reference {error:.3g} (allowed {GPT_TOLERANCE:g})"
                           + (f" -- {hint}" if hint else ""))


def _float64(fn: Callable):
    """Run ``fn`` with float64 as the default dtype (the book's oracle runs in it), then restore."""
    torch = _torch()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return fn()
    finally:
        torch.set_default_dtype(before)


def _scores_softmax(q, k, v, scale: float, mask, dim: int = -1):
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim) @ v


def _tensor_gate(name: str, fn: Callable, cases: Callable) -> GateResult:
    """The loop the gates below share, run in float64: ``cases()`` yields ``(label, args,
    reference)`` for each case; the learner's ``fn(*args)`` is compared with what ``reference()``
    returns, ``(wanted output, hints)``, computed without gradients."""

    def run() -> GateResult:
        torch = _torch()
        result = GateResult(name)
        for label, args, reference in cases():
            got, err = _call(fn, *args)
            if err:
                result.cases += 1
                result.failures.append(f"{label}: {err}")
                continue
            with torch.no_grad():
                want, hints = reference()
            _compare(result, label, got, want, hints)
        return result

    return _float64(run)


def check_attention(attention: Callable) -> GateResult:
    """Gate for module 7: ``attention(q, k, v, causal) -> y``, scaled-dot-product attention over
    tensors shaped (batch, heads, time, head_dim); with ``causal`` a query sees only keys at or
    before its own position."""

    def cases():
        torch = _torch()
        generator = torch.Generator().manual_seed(7)
        for label, shape, causal in [("causal, 5 positions", (2, 3, 5, 4), True),
                                     ("not causal", (1, 2, 6, 8), False),
                                     ("causal, one position", (1, 1, 1, 4), True),
                                     ("causal, head_dim 16", (1, 2, 7, 16), True)]:
            q, k, v = (torch.randn(shape, generator=generator) * 2 for _ in range(3))
            yield label, (q.clone(), k.clone(), v.clone(), causal), _attention_reference(q, k, v, causal)

    return _tensor_gate("attention", attention, cases)


def _attention_reference(q, k, v, causal: bool) -> Callable:
    def reference():
        torch, t, scale = _torch(), q.shape[2], q.shape[-1] ** -0.5
        lower = torch.ones(t, t, dtype=torch.bool).tril()
        mask = lower if causal else None
        hints = {"the scores are not scaled: divide them by sqrt(head_dim)": _scores_softmax(q, k, v, 1.0, mask),
                 "divide the scores by sqrt(head_dim), not head_dim": _scores_softmax(q, k, v, scale**2, mask),
                 "the softmax runs over the keys (the last dim), not the queries": _scores_softmax(
                     q, k, v, scale, mask, dim=-2)}
        if causal:
            hints["the mask is missing: each query must not see later keys"] = _scores_softmax(q, k, v, scale, None)
            hints["the mask is the wrong way round: keep keys at or before the query (lower triangle)"] = (
                _scores_softmax(q, k, v, scale, ~lower | torch.eye(t, dtype=torch.bool)))
        return _scores_softmax(q, k, v, scale, mask), hints

    return reference


def _randomised(module, seed: int):
    """``module`` with every parameter drawn at random (biases and norm gains too), so that a
    forgotten bias or gain shows: at initialisation they are 0 and 1."""
    torch = _torch()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    return module


def _heads(x, layer, n_head: int, causal: bool = True, project: bool = True):
    """Multi-head causal self-attention through ``layer``'s weights, with switches for the usual slips."""
    b, t, c = x.shape
    q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in layer.qkv(x).split(c, dim=2))
    mask = _torch().ones(t, t, dtype=_torch().bool).tril() if causal else None
    y = _scores_softmax(q, k, v, (c // n_head) ** -0.5, mask).transpose(1, 2).reshape(b, t, c)
    return layer.proj(y) if project else y


def _gpt_cases(seed: int):
    from posttrainllm.model import GPT, GPTConfig

    for n_layer, n_head, n_embd, t in [(2, 4, 32, 10), (1, 2, 12, 16), (3, 1, 8, 3)]:
        config = GPTConfig(vocab_size=40, block_size=16, n_layer=n_layer, n_head=n_head, n_embd=n_embd, seed=seed)
        label = f"{n_layer} layer{'s' * (n_layer > 1)}, {n_head} head{'s' * (n_head > 1)}, width {n_embd}, {t} tokens"
        yield label, _randomised(GPT(config), seed), t
        seed += 1


def _model_gate(name: str, seed: int, fn: Callable, case: Callable) -> GateResult:
    """:func:`_tensor_gate` over the small GPTs of :func:`_gpt_cases`: ``case(model, t)`` gives the
    arguments for ``fn`` and the reference."""
    return _tensor_gate(name, fn, lambda: ((label, *case(model, t)) for label, model, t in _gpt_cases(seed)))


def _stream(model, t: int):
    torch = _torch()
    return torch.randn(2, t, model.config.n_embd, generator=torch.Generator().manual_seed(t))


def check_self_attention(self_attention: Callable) -> GateResult:
    """Gate for module 7: ``self_attention(x, layer, n_head) -> y``, causal multi-head
    self-attention with the weights of ``layer`` (the package's ``CausalSelfAttention``: ``qkv``
    projects to queries, keys and values side by side, ``proj`` mixes the heads' outputs)."""

    def case(model, t: int):
        x, layer, n_head = _stream(model, t), model.blocks[0].attn, model.config.n_head

        def reference():
            hints = {"the mask is missing: position i must not see positions after i": _heads(
                         x, layer, n_head, causal=False),
                     "the heads' outputs still need the output projection, layer.proj": _heads(
                         x, layer, n_head, project=False)}
            if n_head > 1:
                hints[f"split the width into n_head={n_head} heads of {x.shape[-1] // n_head}, "
                      "attend within each, then join them"] = _heads(x, layer, 1)
            return layer(x), hints

        return (x.clone(), layer, n_head), reference

    return _model_gate("self_attention", 11, self_attention, case)


def check_block(block: Callable) -> GateResult:
    """Gate for module 7: ``block(x, layer, n_head) -> x``, a pre-norm transformer block with the
    weights of ``layer`` (the package's ``Block``: ``norm1``, ``attn``, ``norm2``, ``mlp`` with
    ``up`` and ``proj`` around a GELU)."""

    def case(model, t: int):
        x, layer = _stream(model, t), model.blocks[-1]

        def reference():
            h = layer.norm1(x + layer.attn(x))
            mid = x + layer.attn(layer.norm1(x))
            hints = {"that is post-norm (normalise after adding): pre-norm normalises each sublayer's input "
                     "and adds its output to the unnormalised stream": layer.norm2(h + layer.mlp(h)),
                     "add each sublayer's output to its input (the residual connection)": layer.mlp(
                         layer.norm2(layer.attn(layer.norm1(x)))),
                     "the MLP's nonlinearity is GELU": mid + layer.mlp.proj(
                         _torch().relu(layer.mlp.up(layer.norm2(mid))))}
            return layer(x), hints

        return (x.clone(), layer, model.config.n_head), reference

    return _model_gate("block", 21, block, case)


def check_gpt_forward(gpt_forward: Callable) -> GateResult:
    """Gate for module 7: ``gpt_forward(model, idx) -> logits``, the whole GPT on the weights of
    ``model`` (the package's ``GPT``: ``tok_emb``, ``pos_emb``, ``blocks``, ``norm``, ``head``),
    checked against ``model(idx)`` itself."""

    def case(model, t: int):
        torch = _torch()
        idx = torch.randint(0, model.config.vocab_size, (2, t), generator=torch.Generator().manual_seed(t))

        def reference():
            stream = model.tok_emb(idx) + model.pos_emb(torch.arange(t))
            unplaced = model.tok_emb(idx)
            for layer in model.blocks:
                stream, unplaced = layer(stream), layer(unplaced)
            hints = {"add the position embeddings, model.pos_emb(positions 0..t-1), to the token embeddings":
                     model.head(model.norm(unplaced)),
                     "normalise the stream (model.norm) before the head": model.head(stream)}
            return model(idx), hints

        return (model, idx.clone()), reference

    return _model_gate("gpt_forward", 31, gpt_forward, case)


# --- the spine: the training step, encode, the FA2 tile, loss scaling, DPO, the SAE step and
# the speculative verify, each checked against the package's own code; a slip that matches one
# of a gate's wrong variants is named.


def _named_slip(got, variants: dict[str, object], same: Callable[[object, object], bool]) -> str:
    """`` -- hint`` for the first wrong variant ``got`` matches, else ``""``."""
    hint = next((h for h, alt in variants.items() if same(got, alt)), None)
    return f" -- {hint}" if hint else ""


def _mlp_trajectory(step: Callable, seed: int, batches, lr: float):
    """Losses and final weights after ``step(model, X, y, lr)`` on each batch of a fresh MLP."""
    from posttrainllm import nn

    model = nn.MLP([2, 4, 2], activation="tanh", seed=seed)
    losses = [float(step(model, X, y, lr)) for X, y in batches]
    return losses, np.array([p.data for p in model.parameters()])


def _reference_train_step(model, X, y, lr: float, sign: float = 1.0, zero: bool = True) -> float:
    """One full-batch gradient step on the mean cross-entropy (``sign``/``zero`` make the slips)."""
    from posttrainllm import nn

    loss = nn.batch_loss(model, X, y)
    if zero:
        model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data -= sign * lr * p.grad
    return loss.data


def check_train_step(train_step: Callable) -> GateResult:
    """Gate for module 4: ``train_step(model, X, y, lr) -> loss``, one gradient-descent step of an
    ``nn.MLP`` on the mean cross-entropy of the batch; returns the loss before the step.

    Three steps are taken from the same initialisation as the reference, so gradients left from
    the previous step (a missing ``zero_grad``) show from the second step on."""
    result = GateResult("train_step")
    rng = np.random.default_rng(4)
    variants = {
        "the weights moved uphill: subtract lr * grad": lambda m, X, y, lr: _reference_train_step(m, X, y, lr, -1.0),
        "gradients pile up across steps: zero them before backward()": lambda m, X, y, lr: _reference_train_step(
            m, X, y, lr, zero=False),
    }
    for label, n, seed, lr in [("8 points, lr 0.5", 8, 0, 0.5), ("3 points, lr 0.1", 3, 1, 0.1),
                               ("one point, lr 1.0", 1, 2, 1.0)]:
        result.cases += 1
        batches = [(rng.standard_normal((n, 2)), rng.integers(0, 2, n)) for _ in range(3)]
        want = _mlp_trajectory(_reference_train_step, seed, batches, lr)
        got, err = _call(_mlp_trajectory, train_step, seed, batches, lr)
        if err:
            result.failures.append(f"{label}: {err}")
            continue
        if not np.isclose(got[0][0], want[0][0], atol=1e-10):
            hint = " -- average the loss over the batch" if np.isclose(got[0][0], want[0][0] * n) else ""
            result.failures.append(f"{label}: first loss {got[0][0]:.6f}, expected {want[0][0]:.6f} "
                                   f"(the mean cross-entropy before the step){hint}")
        elif not np.allclose(got[1], want[1], atol=1e-10):
            slips = {h: _mlp_trajectory(v, seed, batches, lr)[1] for h, v in variants.items()}
            hint = _named_slip(got[1], slips, lambda a, b: np.allclose(a, b, atol=1e-10))
            if not hint and np.allclose(got[1], _mlp_trajectory(lambda *a: 0.0, seed, batches, lr)[1]):
                hint = " -- the weights never changed: update p.data after backward()"
            result.failures.append(f"{label}: after 3 steps the weights are off by "
                                   f"{np.abs(got[1] - want[1]).max():.3g}{hint}")
        elif not np.allclose(got[0], want[0], atol=1e-10):
            result.failures.append(f"{label}: losses {_fmt(got[0])}, expected {_fmt(want[0])}: return the loss "
                                   "computed before the update")
    return result


def check_encode(encode_chunk: Callable) -> GateResult:
    """Gate for module 6: ``encode_chunk(ids, merges) -> ids``, BPE encoding of one pre-token's
    bytes. ``merges`` maps a pair to its new id, in the order training learned them: the pair
    learned earliest (lowest id) is merged first, wherever it sits, until no pair is a merge.
    Reference: the package's ``Tokenizer`` on the same merges."""
    from posttrainllm.tokenizer import Tokenizer, merge_pair

    trained = Tokenizer.train("the theme of the thesis: then there, these three thinkers. " * 4, 280)
    hand = [(98, 99), (97, 98), (97, 256)]  # "bc", then "ab", then "a" + "bc"
    doubling = [(97, 97), (256, 256)]
    cases = [("merges learned in the reverse of reading order: 'abc'", hand, "abc"),
             ("a merge of merges: 'aaaa' becomes one token", doubling, "aaaa"),
             ("an odd run: 'aaaaa'", doubling, "aaaaa"),
             ("no merge applies", hand, "xyz"),
             ("one byte", hand, "a"),
             ("merges trained on text, the word ' thesis'", trained.merges, " thesis"),
             ("merges trained on text, the word ' thinkers'", trained.merges, " thinkers")]
    result = GateResult("encode_chunk")
    for label, merges, text in cases:
        result.cases += 1
        ranks = {tuple(p): 256 + i for i, p in enumerate(merges)}
        want = Tokenizer(list(merges)).encode_ordinary(text)
        got, err = _call(encode_chunk, list(text.encode()), dict(ranks))
        if err:
            result.failures.append(f"{label}: {err}")
        elif list(got or []) != want:
            scan = list(text.encode())  # the slip: merge whatever pair comes first in the text
            for _ in range(len(scan)):
                first = next((pair for pair in zip(scan, scan[1:]) if pair in ranks), None)  # noqa: B905
                scan = merge_pair(scan, first, ranks[first]) if first else scan
            once = list(text.encode())
            best = min(zip(once, once[1:]), key=lambda p: ranks.get(p, 1 << 30), default=None)  # noqa: B905
            once = merge_pair(once, best, ranks[best]) if best in ranks else once
            hint = _named_slip(list(got or []), {
                "merge the pair learned earliest (lowest id) first, wherever it is, not the leftmost": scan,
                "keep merging until no adjacent pair is in merges": once}, lambda a, b: a == b)
            result.failures.append(f"{label}: expected {want}, got {got}{hint}")
    return result


def _flash_loop(tile_update: Callable, q, k, v, causal: bool, block: int) -> np.ndarray:
    """FlashAttention-2's forward for one head, with ``tile_update`` folding in each key block."""
    from posttrainllm.attention import causal_mask

    n, d = q.shape
    scores = (q / np.sqrt(d)) @ k.T
    if causal:
        scores = np.where(causal_mask(n), scores, -np.inf)
    out = np.empty_like(v)
    for r in range(0, n, block):
        rows = slice(r, r + block)
        peak, total, acc = np.full(len(q[rows]), -np.inf), np.zeros(len(q[rows])), np.zeros((len(q[rows]), d))
        for c in range(0, n, block):
            if causal and c > rows.stop - 1:
                break
            peak, total, acc = (np.asarray(a, dtype=float)
                                for a in tile_update(peak, total, acc, scores[rows, c:c + block], v[c:c + block]))
        with np.errstate(divide="ignore", invalid="ignore"):  # a wrong update's nan is reported, not warned
            out[rows] = acc / total[:, None]
    return out


def _tile_slip(rescale_total: bool, rescale_acc: bool) -> Callable:
    def update(peak, total, acc, s, v):
        new = np.maximum(peak, s.max(axis=1))
        p, fix = np.exp(s - new[:, None]), np.exp(peak - new)
        return new, total * (fix if rescale_total else 1) + p.sum(1), acc * (fix[:, None] if rescale_acc else 1) + p @ v

    return update


def check_flash_tile(tile_update: Callable) -> GateResult:
    """Gate for module 7: ``tile_update(peak, total, acc, s, v) -> (peak, total, acc)``, the inner
    step of FlashAttention-2's forward. ``s`` is one tile of scaled (and causally masked) scores,
    ``v`` the tile's values; ``peak``, ``total`` and ``acc`` are each query row's running max,
    running sum of exponentials and unnormalised output. Folded over the key blocks, ``acc / total``
    must equal softmax attention (:func:`posttrainllm.attention.attention`)."""
    from posttrainllm.attention import attention

    result = GateResult("flash_tile")
    rng = np.random.default_rng(17)
    slips = {"rescale acc by exp(old peak - new peak) too, not only the running sum": _tile_slip(True, False),
             "rescale the running sum by exp(old peak - new peak) when the peak grows": _tile_slip(False, True)}
    for label, n, d, block, causal, size in [("6 queries, blocks of 2", 6, 4, 2, False, 1.0),
                                             ("causal, 7 queries, blocks of 3 (a partial block)", 7, 4, 3, True, 1.0),
                                             ("scores near 1000 (exp would overflow)", 5, 2, 2, False, 30.0),
                                             ("one block holds everything", 4, 3, 8, True, 1.0)]:
        result.cases += 1
        q, k, v = (rng.standard_normal((n, d)) * size for _ in range(3))
        want = attention(q, k, v, causal=causal)
        got, err = _call(_flash_loop, tile_update, q, k, v, causal, block)
        if err:
            result.failures.append(f"{label}: {err}")
        elif not np.allclose(got, want, atol=1e-9):
            hint = _named_slip(got, {h: _flash_loop(s, q, k, v, causal, block) for h, s in slips.items()},
                               lambda a, b: np.allclose(a, b, atol=1e-9))
            error = f"off by {np.abs(got - want).max():.3g}"
            if not np.isfinite(got).all():
                error, hint = "holds inf or nan", " -- subtract the running peak before exp()"
            result.failures.append(f"{label}: the output {error}{hint}")
    return result


def check_loss_scaling(scaler_step: Callable) -> GateResult:
    """Gate for module 8: ``scaler_step(grads, scale, good_steps, growth_interval) ->
    (grads or None, scale, good_steps)``, dynamic loss scaling for one step. ``grads`` were
    computed from the loss times ``scale``: divide them back; if any is inf or nan, return None
    (skip the step), halve the scale and restart the count; after ``growth_interval`` good steps
    in a row, double the scale. Followed step by step against the package's ``LossScaler``."""
    torch = _torch()
    from posttrainllm.mixed_precision import LossScaler

    result = GateResult("scaler_step")
    rng = np.random.default_rng(88)
    runs = [("six good steps, growth every 3", 3, []), ("an overflow at step 3", 3, [(2, np.inf)]),
            ("a nan at step 2, then an inf at step 5", 2, [(1, np.nan), (4, -np.inf)]),
            ("overflow on the first step", 4, [(0, np.inf)])]
    for label, interval, bad in runs:
        result.cases += 1
        reference, scale, good = LossScaler(scale=1024.0, growth_interval=interval), 1024.0, 0
        for step in range(6):
            grads = [rng.standard_normal(3) * 1024.0, rng.standard_normal((2, 2)) * 1024.0]
            for at, value in bad:
                if at == step:
                    grads[1][0, 1] = value
            tensors = [torch.tensor(g) for g in grads]
            found_inf = reference.unscale_(tensors)
            reference.update(found_inf)
            out, err = _call(scaler_step, [g.copy() for g in grads], scale, good, interval)
            where = f"{label}, step {step + 1}"
            if err or not (isinstance(out, tuple) and len(out) == 3):
                result.failures.append(f"{where}: {err or f'expected (grads or None, scale, good_steps), got {out!r}'}")
                break
            got_grads, scale, good = out
            if found_inf and got_grads is not None:
                result.failures.append(f"{where}: a gradient is not finite, so the step must be skipped (return None)")
                break
            if not found_inf and (got_grads is None or not all(
                    np.allclose(np.asarray(g), t.numpy()) for g, t in zip(got_grads, tensors, strict=True))):
                result.failures.append(f"{where}: the gradients are finite, so they come back divided by the scale")
                break
            if (scale, good) != (reference.scale, reference.good_steps):
                result.failures.append(f"{where}: scale {scale:g} after {good} good steps, expected scale "
                                       f"{reference.scale:g} after {reference.good_steps}")
                break
    return result


def check_dpo_loss(dpo_loss: Callable) -> GateResult:
    """Gate for module 9: ``dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
    beta) -> loss``, the mean DPO loss of Rafailov et al. (2023) over a batch of pairs, from
    summed sequence log-probabilities. Reference: :func:`posttrainllm.preference.dpo_loss`."""
    from posttrainllm.preference import dpo_loss as reference

    def cases():
        torch, F = _torch(), _torch().nn.functional
        generator = torch.Generator().manual_seed(9)
        for label, n, beta, spread in [("four pairs, beta 0.1", 4, 0.1, 5.0), ("one pair, beta 0.5", 1, 0.5, 2.0),
                                       ("large margins, beta 2", 6, 2.0, 40.0)]:
            pc, pr, rc, rr = (-torch.rand(n, generator=generator) * spread - 1 for _ in range(4))

            def want(pc=pc, pr=pr, rc=rc, rr=rr, beta=beta):
                margin = beta * ((pc - rc) - (pr - rr))
                hints = {"the loss is -log sigmoid(margin); a minus sign is lost": F.logsigmoid(margin).mean(),
                         "measure each log-probability against the reference model's": -F.logsigmoid(
                             beta * (pc - pr)).mean(),
                         "the margin is the chosen log-ratio minus the rejected one": -F.logsigmoid(-margin).mean(),
                         "average the loss over the pairs": -F.logsigmoid(margin).sum(),
                         "multiply the margin by beta": -F.logsigmoid(margin / beta).mean()}
                return reference(pc, pr, rc, rr, beta)[0], hints

            yield label, (pc.clone(), pr.clone(), rc.clone(), rr.clone(), beta), want

    return _tensor_gate("dpo_loss", dpo_loss, cases)


def _ids(value) -> list[int] | None:
    """``value`` as a list of plain ints (a list, tuple, array or tensor of whole numbers), else ``None``."""
    try:
        ids = [plain(v) for v in value]
    except TypeError:
        return None
    if not all(isinstance(i, int) or (isinstance(i, float) and i.is_integer()) for i in ids):
        return None
    return [int(i) for i in ids]


def check_sft_targets(sft_targets: Callable) -> GateResult:
    """Gate for module 9: ``sft_targets(prompt, response, end) -> (inputs, targets)``, one chat
    example as SFT trains on it: ``prompt`` (the chat tokens included) and ``response`` are lists of
    ids and ``end`` is the end token; the inputs are prompt and response, the targets the next token
    at each position, ``-100`` (ignored by the loss) wherever that token is still the prompt's.
    Reference: :func:`posttrainllm.sft.render_ids`."""
    from posttrainllm.sft import IGNORE, render_ids

    result = GateResult("sft_targets")
    cases = [("a three-token prompt, a two-token answer", [1, 5, 2], [7, 8], 0),
             ("a one-token answer", [1, 9, 9, 9, 2], [4], 0),
             ("an empty answer: only the end token is trained", [1, 6, 2], [], 3),
             ("a long prompt", [1, *range(10, 40), 2], [50, 51, 52], 0)]
    for label, prompt, response, end in cases:
        result.cases += 1
        want = render_ids(prompt, response, end)
        got, err = _call(sft_targets, list(prompt), list(response), end)
        if err:
            result.failures.append(f"{label}: {err}")
            continue
        if not (isinstance(got, tuple) and len(got) == 2):
            result.failures.append(f"{label}: expected (inputs, targets), got {type(got).__name__}")
            continue
        inputs, targets = (_ids(x) for x in got)
        if inputs is None or targets is None:
            result.failures.append(f"{label}: inputs and targets should be lists of ids, got {got!r}")
            continue
        ids = [*prompt, *response, end]
        slips = {"the targets are the inputs shifted by one: each position predicts the next token": (
                     want[0], [IGNORE if t + 1 < len(prompt) else ids[t] for t in range(len(ids) - 1)]),
                 "the last prompt position predicts the first answer token: train it": (
                     want[0], [IGNORE if t < len(prompt) else ids[t + 1] for t in range(len(ids) - 1)]),
                 "ignore the prompt's own next tokens (-100), or the model learns to write the user's part": (
                     want[0], ids[1:]),
                 "the inputs end before the end token: it is only ever a target": (ids, [*want[1], IGNORE])}
        if (inputs, targets) != (list(want[0]), list(want[1])):
            hint = _named_slip((inputs, targets), slips, lambda a, b: a[0] == list(b[0]) and a[1] == list(b[1]))
            result.failures.append(f"{label}: inputs {inputs}, targets {targets}; expected {want[0]}, "
                                   f"{want[1]}{hint}")
    return result


def check_response_logprob(response_logprob: Callable) -> GateResult:
    """Gate for module 9: ``response_logprob(logits, targets) -> sums``, each row's summed
    log-probability of its response tokens: ``logits`` of shape ``(rows, T, vocab)``, ``targets``
    of shape ``(rows, T)`` with ``-100`` where a position is not trained; one number per row.
    Reference: :func:`posttrainllm.preference.response_logprob`."""
    from posttrainllm.preference import response_logprob as reference

    def cases():
        torch = _torch()
        generator = torch.Generator().manual_seed(19)
        for label, rows, t, vocab, prompt in [("two rows, the first 3 positions ignored", 2, 6, 5, 3),
                                              ("one row, nothing ignored", 1, 4, 7, 0),
                                              ("four rows of 8, a vocabulary of 11, half ignored", 4, 8, 11, 4)]:
            logits = torch.randn(rows, t, vocab, generator=generator) * 3
            targets = torch.randint(0, vocab, (rows, t), generator=generator)
            targets[:, :prompt] = -100
            if rows > 1:
                targets[1, -1] = -100  # rows of unequal length

            def want(logits=logits, targets=targets):
                mask = targets != -100
                logp = torch.log_softmax(logits, -1)
                picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                raw = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                return reference(logits, targets), {
                    "a log-probability needs the log-softmax of the logits, not the logits": (raw * mask).sum(-1),
                    "leave out the ignored positions (-100)": picked.sum(-1),
                    "sum over the response tokens: a sequence's log-probability is the sum": (
                        (picked * mask).sum(-1) / mask.sum(-1))}

            yield label, (logits.clone(), targets.clone()), want

    return _tensor_gate("response_logprob", response_logprob, cases)


def check_lora_merge(merge: Callable) -> GateResult:
    """Gate for module 9: ``merge(W, A, B, alpha, r) -> W_merged``, folding a LoRA adapter into its
    frozen weight so that ``x W_merged^T + b`` gives exactly the LoRA layer's output
    (``x W^T + b + (alpha / r) x A^T B^T``) with no extra cost at inference."""
    result = GateResult("lora_merge")
    rng = np.random.default_rng(19)
    for label, d_in, d_out, r, alpha in [("square layer, rank 2, alpha 4", 5, 5, 2, 4.0),
                                         ("3 inputs -> 7 outputs, rank 1, alpha 16", 3, 7, 1, 16.0),
                                         ("rank 4 with alpha = r", 6, 4, 4, 4.0)]:
        result.cases += 1
        x, w, b = rng.standard_normal((3, d_in)), rng.standard_normal((d_out, d_in)), rng.standard_normal(d_out)
        a, bb = rng.standard_normal((r, d_in)), rng.standard_normal((d_out, r))
        want = x @ w.T + b + (alpha / r) * (x @ a.T) @ bb.T
        got, err = _call(merge, w.copy(), a.copy(), bb.copy(), alpha, r)
        if err:
            result.failures.append(f"{label}: {err}")
        elif np.shape(got) != w.shape:
            result.failures.append(f"{label}: the merged weight has shape {np.shape(got)}, expected W's {w.shape}")
        elif not np.allclose(x @ np.asarray(got).T + b, want, atol=1e-9):
            hint = _named_slip(np.asarray(got), {"scale the update B @ A by alpha / r": w + bb @ a,
                                                 "the merged weight keeps W and adds the update": (alpha / r) * bb @ a},
                               lambda g, alt: np.allclose(g, alt, atol=1e-9))
            result.failures.append(f"{label}: the merged layer's outputs differ from the adapter's "
                                   f"by {np.abs(x @ np.asarray(got).T + b - want).max():.3g}{hint}")
    return result


def check_sae_step(sae_step: Callable) -> GateResult:
    """Gate for module 10: ``sae_step(sae, x, l1, optimizer) -> loss``, one training step of the
    package's ``SparseAutoencoder`` on the batch ``x``: the objective of
    :func:`posttrainllm.sae.sae_loss` (reconstruction plus an L1 weighted by decoder norms),
    backward, one optimizer step; returns the loss before the step."""
    from posttrainllm.sae import SparseAutoencoder, sae_loss

    def reference_step(sae, x, l1, optimizer, loss_fn=sae_loss, zero=True):
        loss = loss_fn(sae, x, l1)
        if zero:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    def plain_l1(sae, x, l1):
        x_hat, f = sae(x)
        return (x - x_hat).pow(2).sum(-1).mean() + l1 * f.sum(-1).mean()

    def run(step, seed: int, l1: float):
        torch = _torch()
        sae = SparseAutoencoder(6, 12, seed=seed)
        optimizer = torch.optim.Adam(sae.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(seed)
        losses = [float(step(sae, torch.randn(16, 6, generator=generator), l1, optimizer)) for _ in range(3)]
        return losses, torch.cat([p.detach().flatten() for p in sae.parameters()]).numpy()

    def gate() -> GateResult:
        result = GateResult("sae_step")
        slips = {"weight each feature's L1 by its decoder column's norm": lambda *a: reference_step(
                     *a, loss_fn=plain_l1),
                 "zero the gradients before backward()": lambda *a: reference_step(*a, zero=False)}
        for label, seed, l1 in [("l1 = 0.1", 0, 0.1), ("l1 = 1.0", 1, 1.0), ("no penalty (l1 = 0)", 2, 0.0)]:
            result.cases += 1
            want = run(reference_step, seed, l1)
            got, err = _call(run, sae_step, seed, l1)
            if err:
                result.failures.append(f"{label}: {err}")
            elif not (np.allclose(got[0], want[0], atol=1e-9) and np.allclose(got[1], want[1], atol=1e-9)):
                hint = _named_slip(got, {h: run(s, seed, l1) for h, s in slips.items()},
                                   lambda a, b: np.allclose(a[1], b[1], atol=1e-9))
                result.failures.append(f"{label}: losses {_fmt(got[0])}, expected {_fmt(want[0])}; "
                                       f"weights off by {np.abs(got[1] - want[1]).max():.3g} after 3 steps{hint}")
        return result

    return _float64(gate)


def check_group_advantages(group_advantages: Callable) -> GateResult:
    """Gate for module 10: ``group_advantages(rewards) -> advantages``, GRPO's advantages for
    rewards of shape ``(prompts, group)``: each reward minus its group's mean, divided by the
    group's population standard deviation plus 1e-6 (so a group whose rewards are all equal gets
    0, not 0 / 0). Reference: :func:`posttrainllm.rl.group_advantages`."""
    from posttrainllm.rl import group_advantages as reference

    def cases():
        torch = _torch()
        generator = torch.Generator().manual_seed(10)
        wins = (torch.rand(3, 4, generator=generator) < 0.5).double()
        wins[:, 0], wins[:, 1] = 1.0, 0.0  # every group contested
        composite = torch.tensor([[0.0, 0.2, 1.2, 0.2, 0.2, 0.0, 1.2, 0.2]])
        unanimous = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
        for label, rewards in [("three prompts, groups of 4 rewards of 0 or 1", wins),
                               ("one group of 8 composite rewards", composite),
                               ("a group whose rewards are all equal (std 0) beside one that is not", unanimous)]:

            def want(rewards=rewards):
                centred = rewards - rewards.mean(-1, keepdim=True)
                return reference(rewards), {
                    "divide by the population std (unbiased=False): the group's own spread": centred / (
                        rewards.std(-1, keepdim=True) + 1e-6),
                    "divide the centred rewards by the group's std": centred,
                    "centre each reward on its own group's mean, not the whole batch's": (
                        rewards - rewards.mean()) / (rewards.std(-1, keepdim=True, unbiased=False) + 1e-6)}

            yield label, (rewards.clone(),), want

    return _tensor_gate("group_advantages", group_advantages, cases)


def check_grpo_loss(grpo_loss: Callable) -> GateResult:
    """Gate for module 10: ``grpo_loss(new, old, ref, mask, advantages, clip, kl_coef) -> loss``,
    GRPO's objective as a loss: per token, ``min(r A, clip(r, 1 - clip, 1 + clip) A) - kl_coef * k3``
    with ``r = exp(new - old)`` and the k3 KL estimate ``e^(ref - new) - (ref - new) - 1``; minus
    its mean over every token in ``mask`` at once. ``new``, ``old`` and ``ref`` hold each sampled
    token's log-probability, shape ``(responses, T)``; ``advantages`` one value per response.
    Reference: :func:`posttrainllm.rl.grpo_loss`, token mean."""
    from posttrainllm.rl import aggregate, k3
    from posttrainllm.rl import grpo_loss as reference

    def cases():
        torch = _torch()
        generator = torch.Generator().manual_seed(11)
        for label, lengths, clip, kl_coef in [("three answers of 2, 5 and 3 tokens", [2, 5, 3], 0.2, 0.04),
                                              ("one answer of 4 tokens, no KL penalty", [4], 0.2, 0.0),
                                              ("four answers, clip 0.1, KL weight 0.5", [6, 1, 3, 6], 0.1, 0.5)]:
            n, width = len(lengths), max(lengths)
            old = -torch.rand(n, width, generator=generator) * 3 - 0.1
            new = old + (torch.rand(n, width, generator=generator) - 0.5)  # ratios well outside the clip range
            ref = old + (torch.rand(n, width, generator=generator) - 0.5) * 0.6
            mask = torch.tensor([[1.0] * m + [0.0] * (width - m) for m in lengths])
            advantages = torch.linspace(-1.2, 1.0, n) if n > 1 else torch.tensor([0.7])

            def want(new=new, old=old, ref=ref, mask=mask, a=advantages[:, None], clip=clip, beta=kl_coef):
                r = torch.exp(new - old)
                clipped = torch.clamp(r, 1 - clip, 1 + clip) * a
                best = torch.minimum(r * a, clipped)
                kl = k3(new, ref)
                return reference(new, old, ref, mask, a[:, 0], clip=clip, kl_coef=beta)[0], {
                    "the loss is minus the objective: gradient descent on it ascends the objective": aggregate(
                        best - beta * kl, mask),
                    "take the minimum of the clipped and the unclipped term (the pessimistic bound)": -aggregate(
                        clipped - beta * kl, mask),
                    "clip the ratio to [1 - clip, 1 + clip]": -aggregate(r * a - beta * kl, mask),
                    "subtract the KL penalty from the objective": -aggregate(best + beta * kl, mask),
                    "the k3 estimate is exp(ref - new) - (ref - new) - 1": -aggregate(
                        best - beta * (new - ref), mask),
                    "average only the tokens in the mask": -(best - beta * kl).mean(),
                    "average every token of the batch at once (the token mean), not each answer first": -aggregate(
                        best - beta * kl, mask, "sequence")}

            yield label, (new.clone(), old.clone(), ref.clone(), mask.clone(), advantages.clone(), clip, kl_coef), want

    return _tensor_gate("grpo_loss", grpo_loss, cases)


def check_mcnemar_p(mcnemar_p: Callable) -> GateResult:
    """Gate for module 10: ``mcnemar_p(first, second) -> p``, McNemar's exact two-sided test of two
    models' right/wrong answers to the same questions (two boolean arrays): with ``b`` questions
    only the first got right and ``c`` only the second, twice ``P(X <= min(b, c))`` for ``X ~
    Binomial(b + c, 1/2)``, at most 1, and 1 when they never disagree (McNemar, 1947). Reference:
    :func:`posttrainllm.comparison.mcnemar_p`."""
    from posttrainllm.comparison import mcnemar_p as reference

    def tail(n: int, k: int, strict: bool = False) -> float:
        return sum(math.comb(n, i) for i in range(k if strict else k + 1)) / 2**n

    result = GateResult("mcnemar_p")
    rng = np.random.default_rng(47)
    for label, b, c, both, neither in [("10 questions only the first got right, 2 only the second", 10, 2, 30, 18),
                                       ("as many either way: no evidence at all", 7, 7, 20, 6),
                                       ("they never disagree", 0, 0, 25, 15),
                                       ("400 questions, 31 against 15", 15, 31, 150, 204)]:
        result.cases += 1
        first = np.array([True] * b + [False] * c + [True] * both + [False] * neither)
        second = np.array([False] * b + [True] * c + [True] * both + [False] * neither)
        order = rng.permutation(len(first))
        first, second = first[order], second[order]
        want = reference(first, second)
        got, err = _call(mcnemar_p, first.copy(), second.copy())
        number = _number(got)
        if err:
            result.failures.append(f"{label}: {err}")
        elif number is None:
            result.failures.append(f"{label}: expected a number, got {got!r}")
        elif not math.isclose(number, want, rel_tol=1e-9, abs_tol=1e-12):
            n, k = b + c, min(b, c)
            slips = {"two-sided: double the smaller tail": tail(n, k) if n else None,
                     "only the questions the two disagree on count": min(1.0, 2 * tail(len(first), k)),
                     "at least as uneven includes the observed split itself: P(X <= min(b, c))": (
                         min(1.0, 2 * tail(n, k, strict=True)) if n else None),
                     "a probability is at most 1: cap twice the tail at 1": 2 * tail(n, k) if n else None}
            hint = _named_slip(number, slips, lambda g, alt: alt is not None and math.isclose(g, alt, rel_tol=1e-9))
            result.failures.append(f"{label}: got {number:.6g}, expected {want:.6g}{hint}")
    return result


def check_verify(verify: Callable) -> GateResult:
    """Gate for module 10: ``verify(p, q, token, u) -> (accepted, replacement)``, speculative
    decoding's rule for one draft ``token``: ``p`` and ``q`` are the target's and the draft's
    distributions, ``u`` a uniform draw. Accept when ``u < min(1, p[token] / q[token])``;
    otherwise ``replacement`` is the distribution to resample from, ``max(0, p - q)``
    renormalised (None when accepted). The last case checks the point of it all: over ``token ~ q``
    and ``u``, the output is distributed exactly as ``p`` (Leviathan et al., 2023)."""
    from posttrainllm.speculative import accepts, residual

    result = GateResult("verify")
    rng = np.random.default_rng(10)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    up, down = int(np.argmax(p / q)), int(np.argmin(p / q))
    cases = [(f"the target likes token {up} more than the draft: always kept", up, 0.999),
             (f"token {down}, u below p/q: kept", down, 0.5 * p[down] / q[down]),
             (f"token {down}, u above p/q: rejected", down, 0.5 + 0.5 * p[down] / q[down])]
    for label, token, u in cases:
        result.cases += 1
        out, err = _call(verify, p.copy(), q.copy(), token, float(u))
        kept = accepts(p, q, token, u)
        if err or not (isinstance(out, tuple) and len(out) == 2):
            result.failures.append(f"{label}: {err or f'expected (accepted, replacement), got {out!r}'}")
        elif bool(out[0]) != kept:
            hint = " -- keep with probability min(1, p[token] / q[token])"
            result.failures.append(f"{label}: accepted={bool(out[0])}, expected {kept}{hint}")
        elif not kept and (out[1] is None or np.shape(out[1]) != p.shape):
            result.failures.append(f"{label}: a rejection returns the distribution to resample from, got {out[1]!r}")
        elif not kept and not np.allclose(out[1], residual(p, q)):
            hint = "" if np.isclose(np.sum(out[1]), 1) else " -- renormalise max(0, p - q) to sum to 1"
            result.failures.append(f"{label}: resample from {_fmt(residual(p, q))}, got {_fmt(out[1])}{hint}")
    result.cases += 1
    grid = (np.arange(400) + 0.5) / 400  # u at evenly spaced points: the integral over u, exactly enough
    try:
        output = np.zeros_like(p)
        for token in range(len(p)):
            for u in grid:
                kept, replacement = verify(p.copy(), q.copy(), token, float(u))
                output += q[token] / len(grid) * (np.eye(len(p))[token] if kept else np.asarray(replacement))
    except Exception as err:  # noqa: BLE001 - reported, not raised
        result.failures.append(f"the output distribution: raised {type(err).__name__}: {err}")
        return result
    if not np.allclose(output, p, atol=5e-3):
        result.failures.append(f"the output distribution: drafting from q and verifying gives {_fmt(output)}, "
                               f"the target's p is {_fmt(p)}")
    return result


# --- write it: the smaller pieces of modules 1, 3 and 5 -------------------------------------


def check_mse_grad(mse_grad: Callable) -> GateResult:
    """Gate for module 1: ``mse_grad(theta, x, y) -> [dL/dw, dL/db]``, the gradient of the mean
    squared error of the line ``w x + b`` (``theta = [w, b]``) by the chain rule. Reference:
    :func:`posttrainllm.linear.mse_grad`."""
    from posttrainllm import linear

    result = GateResult("mse_grad")
    x, y = linear.make_line_data(n=20, slope=2.0, intercept=-1.0, seed=21)
    for label, theta, xs, ys in [("a line below the data", np.array([0.5, 0.3]), x, y),
                                 ("a line above the data", np.array([3.0, 2.0]), x, y),
                                 ("the best line (the gradient vanishes)", linear.fit_closed_form(x, y), x, y),
                                 ("three points", np.array([1.0, -1.0]), np.array([0.0, 1.0, 3.0]),
                                  np.array([1.0, 2.0, 2.0]))]:
        result.cases += 1
        want = linear.mse_grad(theta, xs, ys)
        got, err = _call(mse_grad, theta.copy(), xs.copy(), ys.copy())
        if err:
            result.failures.append(f"{label}: {err}")
        elif np.shape(got) != (2,):
            result.failures.append(f"{label}: expected [dL/dw, dL/db], got {got!r}")
        elif not np.allclose(got, want, atol=1e-9):
            hint = _named_slip(np.asarray(got, dtype=float), {
                "the square's derivative brings a factor 2": want / 2,
                "the residual is prediction minus target (or the sign of the whole gradient is flipped)": -want,
                "the loss is a mean, so its gradient is divided by n": want * len(xs)},
                lambda a, b: np.allclose(a, b, atol=1e-9))
            result.failures.append(f"{label}: expected {_fmt(want)}, got {_fmt(got)}{hint}")
    return result


def check_momentum(descend: Callable) -> GateResult:
    """Gate for module 2: ``descend(grad, theta0, lr, momentum, steps) -> theta``, gradient descent
    with heavy-ball momentum: each step ``v = momentum * v + grad(theta)``, then
    ``theta = theta - lr * v``, from ``v = 0``. Reference:
    :func:`posttrainllm.gradient_descent.gradient_descent`."""
    from posttrainllm.gradient_descent import gradient_descent

    result = GateResult("momentum")
    stretched = np.diag([10.0, 0.5])
    cases = [("a stretched bowl, momentum 0.9", stretched, np.array([1.0, 1.0]), 0.05, 0.9, 40),
             ("momentum 0 is plain descent", stretched, np.array([-2.0, 1.0]), 0.05, 0.0, 10),
             ("a tilted bowl, momentum 0.5", np.array([[3.0, 1.0], [1.0, 2.0]]), np.array([0.5, -1.5]), 0.1, 0.5, 25)]
    for label, hessian, theta0, lr, momentum, steps in cases:
        result.cases += 1

        def grad(theta, h=hessian):
            return h @ theta

        want = gradient_descent(lambda t: 0.0, grad, theta0, lr, steps, momentum=momentum).thetas[-1]
        got, err = _call(descend, grad, theta0.copy(), lr, momentum, steps)
        if err:
            result.failures.append(f"{label}: {err}")
        elif np.shape(got) != theta0.shape or not np.allclose(got, want, atol=1e-9):
            plain = gradient_descent(lambda t: 0.0, grad, theta0, lr, steps).thetas[-1]
            hint = " -- the velocity must carry over from step to step" if (
                momentum and np.allclose(got, plain, atol=1e-9)) else ""
            result.failures.append(f"{label}: after {steps} steps theta = {_fmt(got)}, expected {_fmt(want)}{hint}")
    return result


def check_broadcast_shape(broadcast_shape: Callable) -> GateResult:
    """Gate for module 3: ``broadcast_shape(a, b) -> shape``, the shape NumPy gives ``x + y`` for
    arrays of shapes ``a`` and ``b``: align the shapes on the right; each pair of sizes must be
    equal or one of them 1; raise ``ValueError`` when they cannot broadcast."""
    result = GateResult("broadcast_shape")
    cases = [((8, 16, 32), (32,)), ((8, 16, 32), (16, 1)), ((5, 1, 4), (3, 1)), ((), (2, 3)),
             ((1,), (7,)), ((2, 1), (1, 3)), ((8, 16, 32), (16,)), ((3, 4), (2, 3, 4)), ((2, 3), (3, 2))]
    for a, b in cases:
        result.cases += 1
        want, left = _broadcast(a, b), _broadcast(a, b, pad_right=True)
        got, err = _call(broadcast_shape, a, b)
        label = f"{a} with {b}"
        if want is None:
            if not (err and "ValueError" in err):
                hint = " -- align the shapes from the right" if left is not None and got == left else ""
                result.failures.append(f"{label}: these cannot broadcast, so raise ValueError; got "
                                       f"{err or repr(got)}{hint}")
        elif err or not isinstance(got, tuple | list) or tuple(got) != want:
            aligned_left = left is None if err else left is not None and got in (left, list(left))
            hint = " -- align the shapes from the right, not the left" if aligned_left and (
                not err or "ValueError" in err) else ""
            result.failures.append(f"{label}: expected {want}, got {err or got!r}{hint}")
    return result


def _broadcast(a: tuple, b: tuple, pad_right: bool = False) -> tuple | None:
    """The broadcast shape of ``a`` and ``b``, or ``None`` where they do not broadcast; with
    ``pad_right``, the usual slip: the shorter shape padded with 1s on the right."""
    n = max(len(a), len(b))
    a, b = ((tuple(s) + (1,) * (n - len(s)) if pad_right else (1,) * (n - len(s)) + tuple(s)) for s in (a, b))
    if any(i != j and 1 not in (i, j) for i, j in zip(a, b, strict=True)):
        return None
    return tuple(max(i, j) for i, j in zip(a, b, strict=True))


def check_bigram_probs(bigram_probs: Callable) -> GateResult:
    """Gate for module 5: ``bigram_probs(ids, vocab_size, alpha) -> P``, the bigram model from
    counts: ``P[a, b]`` is the probability that ``b`` follows ``a``, from the counts of adjacent
    pairs plus ``alpha`` for every pair (add-alpha smoothing), each row summing to 1. Reference:
    :class:`posttrainllm.ngram.BigramLM`."""
    from posttrainllm.ngram import BigramLM

    result = GateResult("bigram_probs")
    rng = np.random.default_rng(5)
    for label, ids, vocab, alpha in [("a short sequence, alpha 1", np.array([0, 1, 1, 2, 0, 1]), 3, 1.0),
                                     ("no smoothing: unseen pairs get 0", np.array([0, 1, 1, 2, 0, 1, 2]), 3, 0.0),
                                     ("200 random ids over 6 symbols, alpha 0.5", rng.integers(0, 6, 200), 6, 0.5),
                                     ("a symbol never followed by another", np.array([0, 0, 1, 3]), 4, 1.0)]:
        result.cases += 1
        want = BigramLM(vocab, alpha=alpha).fit(ids).probs
        got, err = _call(bigram_probs, ids.copy(), vocab, alpha)
        if err:
            result.failures.append(f"{label}: {err}")
        elif np.shape(got) != want.shape:
            result.failures.append(f"{label}: expected a {want.shape} matrix, got shape {np.shape(got)}")
        elif not np.allclose(got, want, atol=1e-12):
            got = np.asarray(got, dtype=float)
            hint = ""
            backwards = BigramLM(vocab, alpha=alpha).fit(ids[::-1]).probs  # each pair counted as (b, a)
            if np.allclose(got.T, want, atol=1e-12) or np.allclose(got, backwards, atol=1e-12):
                hint = " -- row a is what follows a: P[a, b] counts a then b"
            elif not np.allclose(got.sum(1), 1):
                hint = " -- normalise each row to sum to 1"
            row = int(np.argmax(np.abs(got - want).max(axis=1)))
            result.failures.append(f"{label}: row {row} is {_fmt(got[row])}, expected {_fmt(want[row])}{hint}")
    return result


# --- find out: the reader measures a number and the gate checks it -----------------------
# A find-out gate says whether the answer is too high or too low and how to look, never the
# number itself.


def _find_out(name: str, answer, truth: float, rtol: float, what: str, how: str) -> GateResult:
    """One number against the gate's own measurement ``truth``, within ``rtol`` (0: exactly)."""
    result = GateResult(name, cases=1)
    try:
        value = float(answer)
    except (TypeError, ValueError):
        result.failures.append(f"{what}: expected a number, got {answer!r}")
        return result
    if not math.isfinite(value) or abs(value - truth) > rtol * abs(truth):
        side = "not a number" if math.isnan(value) else "too high" if value > truth else "too low"
        margin = f"within {rtol * 100:g}% passes" if rtol else "it must be exact"
        result.failures.append(f"{what}: {value:g} is {side} ({margin}) -- {how}")
    return result


def check_lowest_loss(answer: float, x: np.ndarray, y: np.ndarray) -> GateResult:
    """Gate for module 1 (find out): the lowest mean squared error any line reaches on the points
    ``x, y``: no choice of ``w`` and ``b`` does better, however long you search."""
    from posttrainllm import linear

    best = linear.mse(linear.predict(linear.fit_closed_form(x, y), x), y)
    return _find_out("lowest_loss", answer, best, 0.005, "the lowest loss of a line on these points",
                     "search w and b, or use the closed form, and print the loss there")


def check_divergence_lr(answer: float, x: np.ndarray, momentum: float = 0.0) -> GateResult:
    """Gate for module 2 (find out): the learning rate above which gradient descent with heavy-ball
    ``momentum`` diverges on the mean squared error of a line through ``x``. The gate's reference is
    the theory, ``2 (1 + momentum) / largest curvature``; you find it by trying rates."""
    from posttrainllm import linear
    from posttrainllm.gradient_descent import max_stable_lr

    return _find_out("divergence_lr", answer, (1 + momentum) * max_stable_lr(linear.mse_hessian(x)), 0.02,
                     f"the largest stable learning rate with momentum {momentum:g}",
                     "run descent at a rate, see whether the loss grows, and bisect between a rate that "
                     "converges and one that does not")


def check_best_tile(answer: int, m: int, n: int, k: int, budget: int) -> GateResult:
    """Gate for module 3 (find out): the smallest tile whose tiled ``m x k @ k x n`` matmul loads at
    most ``budget`` numbers from slow memory (the count of
    :func:`posttrainllm.matmul.tiled_slow_reads`)."""
    from posttrainllm.matmul import tiled_slow_reads

    best = next(t for t in range(1, max(m, n, k) + 1) if tiled_slow_reads(m, n, k, t) <= budget)
    return _find_out("best_tile", answer, best, 0.0, f"the smallest tile within {budget:,} loads",
                     "count the loads for each tile size (your tiled_reads) and take the first within budget")


def check_graph_size(answer: int, loss) -> GateResult:
    """Gate for module 4 (find out): how many ``Value`` nodes the graph behind ``loss`` holds
    (every node ``backward()`` visits, the inputs and parameters included)."""
    from posttrainllm.autograd import topological_order

    return _find_out("graph_size", answer, len(topological_order(loss)), 0.0, "nodes in the graph",
                     "walk back from the loss through each node's parents, counting each node once")


def check_temperature(answer: float, logits: np.ndarray, bits: float) -> GateResult:
    """Gate for module 5 (find out): the sampling temperature at which the distribution
    ``softmax(logits / T)`` has an entropy of ``bits`` bits."""
    from posttrainllm.sampling import next_token_distribution

    def entropy(t: float) -> float:
        p = next_token_distribution(logits, temperature=t)
        p = p[p > 0]
        return float(-(p * np.log2(p)).sum())

    low, high = 1e-3, 1e3
    for _ in range(200):  # the entropy rises with the temperature: bisect on a log scale
        mid = math.sqrt(low * high)
        low, high = (mid, high) if entropy(mid) < bits else (low, mid)
    return _find_out("temperature", answer, low, 0.01, f"the temperature for {bits:g} bits",
                     "compute the entropy of the distribution at a few temperatures and bisect")


def check_compression(answer: float, text: str, held_out: str, vocab_size: int) -> GateResult:
    """Gate for module 6 (find out): bytes per token on ``held_out`` for a BPE tokenizer with
    ``vocab_size`` tokens trained on ``text``."""
    from posttrainllm.tokenizer import Tokenizer

    tok = Tokenizer.train(text, vocab_size)
    truth = len(held_out.encode()) / len(tok.encode_ordinary(held_out))
    return _find_out("compression", answer, truth, 0.005, f"bytes per token at {vocab_size} tokens",
                     "train a tokenizer of that size on the training text and encode the held-out text")


def check_fa2_memory_ratio(answer: float, n: int, block: int) -> GateResult:
    """Gate for module 7 (find out): how many times more extra memory naive causal attention needs
    than FlashAttention-2 with square blocks of ``block``, for one head of ``n`` positions and width
    64 in float32 (the shapes of module 7's measurement), as
    :func:`posttrainllm.measure.extra_peak_bytes` measures them."""
    from posttrainllm import attention as att
    from posttrainllm.measure import extra_peak_bytes

    q, k, v = (np.zeros((1, n, 64), dtype=np.float32) for _ in range(3))  # the values do not change the memory
    naive = extra_peak_bytes(lambda: att.attention(q, k, v, causal=True))
    flash = extra_peak_bytes(lambda: att.flash_attention_forward(q, k, v, True, block, block))
    return _find_out("fa2_memory_ratio", answer, naive / flash, 0.02,
                     f"naive over FA2 extra memory at N = {n}, blocks of {block}",
                     "measure both with extra_peak_bytes, as the Linear memory cell does, and divide")


def check_max_loss_scale(answer: float, grads: np.ndarray) -> GateResult:
    """Gate for module 8 (find out): the largest power-of-two loss scale ``S`` for which ``S * grads``
    has no overflow in fp16."""
    exponent = 0
    with np.errstate(over="ignore"):
        while np.isfinite((grads * 2.0 ** (exponent + 1)).astype(np.float16)).all():
            exponent += 1
        while not np.isfinite((grads * 2.0**exponent).astype(np.float16)).all():
            exponent -= 1
    return _find_out("max_loss_scale", answer, 2.0**exponent, 0.0, "the largest safe power-of-two scale",
                     "multiply by 2^e, cast to float16 and look for inf, for e = 0, 1, 2, …")


def check_energy_rank(answer: int, delta, share: float) -> GateResult:
    """Gate for module 9 (find out): the smallest rank ``r`` for which the best rank-``r``
    approximation of the weight change ``delta`` keeps ``share`` of its energy (the sum of squared
    singular values): the rank a LoRA adapter needs to say most of what a full fine-tune changed."""
    sigma = np.linalg.svd(np.asarray(delta, dtype=float), compute_uv=False)
    energy = np.cumsum(sigma**2) / np.sum(sigma**2)
    best = int(np.searchsorted(energy, share) + 1)
    return _find_out("energy_rank", answer, best, 0.0, f"the rank keeping {share:.0%} of the energy",
                     "take the singular values of the change and add their squares until the share is reached")


def check_alpha_for(answer: float, k: int, tokens: float) -> GateResult:
    """Gate for module 10 (find out): the acceptance rate at which drafting ``k`` tokens gives
    ``tokens`` tokens per target forward on average."""
    from posttrainllm.speculative import expected_tokens_per_forward

    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_forward(mid, k) < tokens else (low, mid)
    return _find_out("alpha_for", answer, low, 0.005, f"the acceptance rate for {tokens:g} tokens per forward "
                     f"at k = {k}", "evaluate your expected_tokens at a few rates and bisect")


# --- the register: every gate, the module whose notebook runs it, and its kind ------------
# "write it": the reader writes a piece the module is about; "find out": the reader measures
# something and the gate checks the number. The book's Mastery page and book/curriculum.md are
# read against this table by the tests, so a gate cannot be added, moved or dropped silently.

WRITE, FIND = "write it", "find out"
GATES: dict[str, tuple[int, str]] = {
    "check_mse_grad": (1, WRITE),
    "check_fit_line": (1, WRITE),
    "check_lowest_loss": (1, FIND),
    "check_numerical_gradient": (2, WRITE),
    "check_momentum": (2, WRITE),
    "check_divergence_lr": (2, FIND),
    "check_broadcast_shape": (3, WRITE),
    "check_tiled_reads": (3, WRITE),
    "check_best_tile": (3, FIND),
    "check_value": (4, WRITE),
    "check_backward": (4, WRITE),
    "check_backward_rule": (4, WRITE),
    "check_train_step": (4, WRITE),
    "check_graph_size": (4, FIND),
    "check_bigram_probs": (5, WRITE),
    "check_top_p": (5, WRITE),
    "check_temperature": (5, FIND),
    "check_train_bpe": (6, WRITE),
    "check_encode": (6, WRITE),
    "check_compression": (6, FIND),
    "check_attention": (7, WRITE),
    "check_self_attention": (7, WRITE),
    "check_block": (7, WRITE),
    "check_gpt_forward": (7, WRITE),
    "check_online_softmax_update": (7, WRITE),
    "check_flash_tile": (7, WRITE),
    "check_fa2_memory_ratio": (7, FIND),
    "check_adamw_update": (8, WRITE),
    "check_warmup_cosine": (8, WRITE),
    "check_accumulated_step": (8, WRITE),
    "check_loss_scaling": (8, WRITE),
    "check_max_loss_scale": (8, FIND),
    "check_sft_targets": (9, WRITE),
    "check_lora_forward": (9, WRITE),
    "check_lora_merge": (9, WRITE),
    "check_response_logprob": (9, WRITE),
    "check_dpo_loss": (9, WRITE),
    "check_energy_rank": (9, FIND),
    "check_sae_step": (10, WRITE),
    "check_verify": (10, WRITE),
    "check_expected_tokens": (10, WRITE),
    "check_alpha_for": (10, FIND),
    "check_group_advantages": (10, WRITE),
    "check_grpo_loss": (10, WRITE),
    "check_mcnemar_p": (10, WRITE),
}


GATE_SECONDS = 60  # past this, a gate stops and says so (no gate needs more than a few seconds)


class _TooSlow(BaseException):
    """Not an ``Exception``: the gates' own ``except Exception`` around the learner's call must let it through."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Stop the block after ``seconds`` where the platform can (the main thread of a Unix process:
    a notebook's kernel); elsewhere the block runs unlimited."""
    def stop(_signum, _frame):
        raise _TooSlow

    try:
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("signals reach only the main thread")
        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    except (AttributeError, OSError, ValueError):  # Windows, Pyodide, a worker thread: no limit
        yield
        return
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# What a skeleton's reader writes first, by gate (named as the record keeps it); the rest follow the docstring.
FIRST = {
    "value": "__add__: the forward value is self.data + other.data, the parents are (self, other), and its "
             "_backward adds out.grad into self.grad and other.grad.",
    "backward": "list the nodes in topological order (each after its parents) with a stack of your own, then add "
                "1 to self.grad and run each node's _backward, from the output back to the inputs.",
    "backward_rule": "the derivative of softplus is the sigmoid, 1 / (1 + e**-x): add it, times "
                              "out.grad, into x.grad.",
    "train_bpe": "the pair counts: for each pre-token (tuple(word) turns its bytes into ids) and its count n, add "
                 "n to the count of every adjacent pair in it.",
    "encode": "among the adjacent pairs of ids that are in merges, take the one with the lowest id (learned "
              "earliest), merge it everywhere, and repeat until no pair is left.",
    "sft_targets": "ids = prompt + response + [end]; the inputs are all of them but the last, and each target "
                   "is the id after its position, or -100 while that id is still the prompt's.",
    "lora_forward": "the frozen layer is x @ W.T + b; the adapter adds (alpha / r) * (x @ A.T) @ B.T.",
    "lora_merge": "the adapter adds (alpha / r) * B @ A to W.",
    "response_logprob": "take torch.log_softmax of the logits, pick each target's entry with gather (after "
                        "turning -100 into a valid index), zero the ignored positions and sum each row.",
    "dpo_loss": "the margin is beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)); the loss "
                "is the mean of -logsigmoid(margin).",
    "broadcast_shape": "pad the shorter shape with 1s on the left until both are as long; then, pair by pair, "
                       "the sizes must be equal or one of them 1, and the result takes the larger.",
    "tiled_reads": "each element of A is loaded once per tile column of the output, ceil(n / tile) times, and "
                   "each element of B once per tile row, ceil(m / tile) times.",
    "bigram_probs": "a (vocab_size, vocab_size) array filled with alpha; add 1 at [a, b] for each adjacent pair "
                    "(a, b) of ids; then divide each row by its sum.",
    "top_p": "order the tokens by probability, most likely first (np.argsort(-probs, kind='stable')), and keep "
             "each token while the mass before it is still below p.",
    "attention": "scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim); with causal, fill the scores above "
                 "the diagonal with -inf (torch.ones(t, t).tril() marks what each query may see).",
    "self_attention": "q, k, v = layer.qkv(x).split(c, dim=2); view each as (b, t, n_head, c // n_head) and "
                      "transpose to (b, n_head, t, head_dim).",
    "block": "x = x + self_attention(layer.norm1(x), layer.attn, n_head): normalise what goes into the sub-layer, "
             "never the stream itself.",
    "gpt_forward": "x = model.tok_emb(idx) + model.pos_emb(positions 0 to t - 1, as torch.arange(idx.shape[1])).",
    "online_softmax_update": "the new peak is max(peak, value); the old total was measured against the old peak, "
                             "so multiply it by math.exp(peak - new_peak).",
    "flash_tile": "the new peak of each row is np.maximum(peak, s.max(axis=1)); then p = np.exp(s - new_peak[:, "
                  "None]), and both total and acc were measured against the old peak.",
    "mse_grad": "the residual r = w * x + b - y; the derivative of r**2 is 2 * r times the derivative of r, "
                "which is x for w and 1 for b; then take the mean over the points.",
    "fit_line": "centre the data, dx = x - np.mean(x) and dy = y - np.mean(y); then w = mean(dx * dy) / "
                "mean(dx * dx).",
    "numerical_gradient": "an array of zeros shaped like theta; for each i, a copy of theta nudged by +eps and "
                          "one by -eps along coordinate i.",
    "momentum": "a velocity of zeros shaped like theta0, then each step v = momentum * v + grad(theta) and "
                "theta = theta - lr * v.",
    "adamw_update": "shrink the weight first, w * (1 - lr * weight_decay); then m and v are running averages "
                    "of g and of g * g, with weights b1 and b2.",
    "warmup_cosine": "the warmup: while step < warmup, the rate is max_lr * (step + 1) / warmup.",
    "accumulated_step": "optimizer.zero_grad() once; then for each (x, y): _, loss = model(x, y) and "
                        "(loss / len(micro_batches)).backward().",
    "loss_scaling": "divide every gradient by scale; if a value is not finite (np.isfinite), the step is lost: "
                    "return (None, scale / 2, 0).",
    "train_step": "loss = nn.batch_loss(model, X, y); then model.zero_grad(), loss.backward(), and "
                  "p.data -= lr * p.grad for each parameter; return loss.data.",
    "sae_step": "x_hat, f = sae(x); the squared error is (x - x_hat).pow(2).sum(-1).mean(), summed over each "
                "vector's dimensions and averaged over the batch; the penalty comes next.",
    "verify": "keep the token when u < min(1, p[token] / q[token]), and return (True, None) then.",
    "expected_tokens": "a round yields at least i + 1 tokens with probability alpha ** i, for i = 0 to k; the "
                       "mean is the sum of those probabilities.",
    "group_advantages": "centre each group (a row) on its own mean: rewards - rewards.mean(-1, keepdim=True).",
    "grpo_loss": "the ratio per token is r = torch.exp(new - old), and each answer's advantage reaches its "
                 "tokens as advantages[:, None].",
    "mcnemar_p": "count b, the questions only the first got right, (first & ~second).sum(), and c, those only "
                 "the second got right.",
}
FIRST_OTHERWISE = "replace `raise NotImplementedError` with your code; its docstring says what it takes and returns."

# The answers that passed a gate in this process, and those still the skeleton (see :func:`yours`).
_PASSED: weakref.WeakSet = weakref.WeakSet()
_SKELETONS: weakref.WeakSet = weakref.WeakSet()


def _is_books(value) -> bool:
    """The package's own function or class (the book's solution, or its reference): not the reader's."""
    return callable(value) and str(getattr(value, "__module__", "")).startswith("posttrainllm")


def _remember(args: tuple, result: GateResult, name: str, record: bool) -> None:
    """Note which answer passed or is a skeleton, and add a pass on the reader's own answer to their
    record (a record that cannot be written is one line, not a failed gate)."""
    answers = [a for a in args if callable(a)]
    for answer in answers:
        with contextlib.suppress(TypeError):  # an object that takes no weak reference
            (_PASSED if result.passed else _SKELETONS if result.first else set()).add(answer)
    if result.passed and record and not any(_is_books(a) for a in answers):
        try:
            progress_record.mark(name)
        except progress_record.RecordError as err:
            print(f"(your pass was not recorded: {err})", file=sys.stderr)


def _guarded(gate: Callable[..., GateResult]) -> Callable[..., GateResult]:
    """The gate, kept to its promise: it returns a :class:`GateResult` within :data:`GATE_SECONDS`,
    whatever it is given (an answer whose ``__bool__``, ``__iter__`` or ``__float__`` raises, a
    number too large for a float, a function that never returns). An answer that is still its
    skeleton is told what to write first; a pass on the reader's own answer goes into their record,
    unless the call says ``record=False`` (the book's solution to a find-out question)."""
    name = gate.__name__.removeprefix("check_")

    @functools.wraps(gate)
    def run(*args, record: bool = True, **kwargs) -> GateResult:
        try:
            with _time_limit(GATE_SECONDS):
                result = gate(*args, **kwargs)
        except _TooSlow:
            return GateResult(name, [f"the check stopped after {GATE_SECONDS} s: does your function loop forever, "
                                     "or return something whose comparison never ends?"], cases=1)
        except Exception as err:  # noqa: BLE001 - the promise: a report, never a crash
            result = GateResult(name, [f"your answer could not be checked: {type(err).__name__}: {err}"], cases=1)
        if not isinstance(result, GateResult):
            return GateResult(name, ["the gate returned no report"], 1)
        if result.failures and all("NotImplementedError" in f for f in result.failures):
            result.first = FIRST.get(name, FIRST_OTHERWISE)
        _remember(args, result, name, record)
        result.books = not record
        return result

    return run


for _gate in GATES:
    globals()[_gate] = _guarded(globals()[_gate])


def yours(name: str, mine, book):
    """``mine`` if it passed its gate in this session, else ``book`` (the book's solution), with
    one line that says which the cells below run: the notebook goes on with the reader's code as
    soon as it passes, and with the book's, visibly, until then."""
    if mine in _PASSED:
        print(f"Your {name} passed its gate: the cells below run yours.")
        return mine
    state = "is still the skeleton" if mine in _SKELETONS else "has not passed its gate yet"
    print(f"Your {name} {state}: the cells below run the book's, until yours passes.")
    return book


def progress(module: int | None = None) -> str:
    """The gates of ``module`` (or of every module) the reader has passed, from their record."""
    try:
        passed = progress_record.load()
    except progress_record.RecordError as err:
        return str(err)
    modules = sorted({m for m, _ in GATES.values()}) if module is None else [module]
    lines = []
    for m in modules:
        gates = [g.removeprefix("check_") for g, (n, _) in GATES.items() if n == m]
        done = [g for g in gates if g in passed]
        todo = [g for g in gates if g not in passed]
        head = f"Module {m}: {len(done)} of {len(gates)} gates passed"
        lines.append(head + (f" ({', '.join(done)})" if done else "") + (f"; not yet: {', '.join(todo)}"
                                                                            if todo else "; all done"))
    return "\n".join(lines)


def describe(gate: str) -> str:
    """A gate's task in Markdown: its docstring's first sentence, after "Gate for module N:"."""
    doc = " ".join(globals()[gate].__doc__.split())
    task = doc.split(":", 1)[1].strip() if doc.startswith("Gate for module") else doc
    task = re.split(r"(?<! al)\. (?=[A-Z`])", task)[0].rstrip(".") + "."
    return re.sub(r"(?::func:)?``?([^`]+)``?", r"`\1`", task)
