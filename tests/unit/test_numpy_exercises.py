"""The exercises of modules 1, 2, 3 and 5, written in numpy, as a reader meets them: the skeletons in the
notebooks are told they are not written yet, a reader's own answers pass and are recorded, the
gates name their slips and fail a wrong answer they have no name for, and each notebook goes on
with the reader's gradient, numerical gradient, broadcasting rule, bigram table and nucleus once
they pass."""

import numpy as np
import pytest

from posttrainllm.solutions import descent, language, line, tensors
from posttrainllm.tools import mastery, record
from tests.conftest import ROOT
from tests.exercises import (
    assert_readers_answers_pass_and_only_they_are_recorded,
    assert_skeletons_are_not_written_yet,
    run_cells,
    run_with_answers,
)

MODULES = [1, 2, 3, 5]
NOTEBOOKS = {m: next((ROOT / "notebooks").glob(f"{m:02d}-*.ipynb")) for m in MODULES}
CALLS = {1: {"mse_grad": "check_mse_grad(mse_grad)", "fit_line": "check_fit_line(fit_line)",
             "lowest_loss": "check_lowest_loss(lowest"},
         2: {"numerical_gradient": "check_numerical_gradient(numerical_gradient)",
             "momentum": "check_momentum(descend)", "divergence_lr": "check_divergence_lr(limit"},
         3: {"broadcast_shape": "check_broadcast_shape(broadcast_shape)",
             "tiled_reads": "check_tiled_reads(tiled_reads)", "best_tile": "check_best_tile(tile"},
         5: {"bigram_probs": "check_bigram_probs(bigram_probs)", "top_p": "check_top_p(top_p_distribution)",
             "temperature": "check_temperature(temperature"}}
FUNCTIONS = {1: {"mse_grad": "mse_grad", "fit_line": "fit_line"},
             2: {"numerical_gradient": "numerical_gradient", "momentum": "descend"},
             3: {"broadcast_shape": "broadcast_shape", "tiled_reads": "tiled_reads"},
             5: {"bigram_probs": "bigram_probs", "top_p": "top_p_distribution"}}
SOLUTIONS = {1: line, 2: descent, 3: tensors, 5: language}

# A reader's answers, written apart from the book's: the cells they type.
READER = {
    "mse_grad": '''
def mse_grad(theta, x, y):
    w, b = theta
    error = w * x + b - y
    return np.array([2 * np.mean(error * x), 2 * np.mean(error)])


mastery.check_mse_grad(mse_grad)
''',
    "fit_line": '''
def fit_line(x, y):
    x_bar, y_bar = np.mean(x), np.mean(y)
    spread = np.mean((x - x_bar) ** 2)
    if spread == 0:
        raise ValueError("every x is the same")
    w = np.mean((x - x_bar) * (y - y_bar)) / spread
    return w, y_bar - w * x_bar


mastery.check_fit_line(fit_line)
''',
    "lowest_loss": '''
w, b = fit_line(x, y)
lowest = np.mean((w * x + b - y) ** 2)

mastery.check_lowest_loss(lowest, x, y)
''',
    "numerical_gradient": '''
def numerical_gradient(f, theta, eps=1e-5):
    theta = np.asarray(theta, dtype=float)
    out = np.empty_like(theta)
    for i in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        out.flat[i] = (f(up) - f(down)) / (2 * eps)
    return out


mastery.check_numerical_gradient(numerical_gradient)
''',
    "momentum": '''
def descend(grad, theta0, lr, momentum, steps):
    theta = np.asarray(theta0, dtype=float).copy()
    v = np.zeros_like(theta)
    for _ in range(steps):
        v = momentum * v + grad(theta)
        theta -= lr * v
    return theta


mastery.check_momentum(descend)
''',
    "divergence_lr": '''
rates = lr_max * np.linspace(1.85, 1.95, 51)
stable = [r for r in rates if np.isfinite(loss(descend(grad, start, r, 0.9, 400)))
          and loss(descend(grad, start, r, 0.9, 400)) <= loss(start)]
limit = max(stable)

mastery.check_divergence_lr(limit, x, momentum=0.9)
''',
    "broadcast_shape": '''
def broadcast_shape(a, b):
    n = max(len(a), len(b))
    a, b = ((1,) * (n - len(s)) + tuple(s) for s in (a, b))
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1:
            raise ValueError(f"{a} and {b} do not broadcast")
        out.append(max(p, q))
    return tuple(out)


mastery.check_broadcast_shape(broadcast_shape)
''',
    "tiled_reads": '''
def tiled_reads(m, n, k, tile):
    a_loads = m * k * ((n + tile - 1) // tile)
    b_loads = k * n * ((m + tile - 1) // tile)
    return a_loads + b_loads


mastery.check_tiled_reads(tiled_reads)
''',
    "best_tile": '''
tile = min(t for t in range(1, 97) if tiled_reads(96, 80, 64, t) <= 50_000)

mastery.check_best_tile(tile, 96, 80, 64, budget=50_000)
''',
    "bigram_probs": '''
def bigram_probs(ids, vocab_size, alpha):
    table = np.zeros((vocab_size, vocab_size)) + alpha
    for current, following in zip(ids, ids[1:]):
        table[current, following] += 1
    return table / table.sum(axis=1)[:, None]


mastery.check_bigram_probs(bigram_probs)
''',
    "top_p": '''
def top_p_distribution(probs, p):
    ranked = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    kept, mass = [], 0.0
    for i in ranked:
        if mass >= p - 1e-12:
            break
        kept.append(i)
        mass += probs[i]
    out = np.zeros(len(probs))
    out[kept] = probs[kept]
    return out / out.sum()


mastery.check_top_p(top_p_distribution)
''',
    "temperature": '''
def bits_at(t):
    q = smp.next_token_distribution(logits, temperature=t)
    q = q[q > 0]
    return -(q * np.log2(q)).sum()


temperature = min(np.geomspace(0.1, 10, 20001), key=lambda t: abs(bits_at(t) - 3.0))

mastery.check_temperature(temperature, logits, bits=3.0)
''',
}


def _run(sources: list[str]) -> dict:
    return run_cells(sources, np=np)


@pytest.mark.parametrize("module", MODULES)
def test_each_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet(module):
    assert_skeletons_are_not_written_yet(NOTEBOOKS[module], CALLS[module], FUNCTIONS[module], _run)


@pytest.mark.parametrize("module", MODULES)
def test_a_readers_own_answers_pass_are_recorded_and_the_books_are_not(module):
    assert_readers_answers_pass_and_only_they_are_recorded(FUNCTIONS[module], SOLUTIONS[module], READER, _run)


SLIPS = [("mse_grad", "return np.array([2 * np.mean(error * x), 2 * np.mean(error)])",
          "return np.array([np.mean(error * x), np.mean(error)])", "brings a factor 2"),
         ("mse_grad", "error = w * x + b - y", "error = y - w * x - b", "prediction minus target"),
         ("mse_grad", "return np.array([2 * np.mean(error * x), 2 * np.mean(error)])",
          "return np.array([2 * np.sum(error * x), 2 * np.sum(error)])", "divided by n"),
         ("fit_line", '        raise ValueError("every x is the same")\n', "        pass\n", "raise ValueError"),
         ("numerical_gradient", "out.flat[i] = (f(up) - f(down)) / (2 * eps)",
          "out.flat[i] = (f(up) - f(theta)) / eps", "one-sided difference"),
         ("numerical_gradient", "up, down = theta.copy(), theta.copy()", "up, down = theta, theta.copy()",
          "changed in place"),
         ("momentum", "v = momentum * v + grad(theta)", "v = grad(theta)", "velocity must carry over"),
         ("broadcast_shape", "((1,) * (n - len(s)) + tuple(s) for s", "(tuple(s) + (1,) * (n - len(s)) for s",
          "align the shapes from the right"),
         ("tiled_reads", "((n + tile - 1) // tile)", "(n // tile)", "count them with a ceiling"),
         ("bigram_probs", "table[current, following] += 1", "table[following, current] += 1",
          "row a is what follows a"),
         ("bigram_probs", "return table / table.sum(axis=1)[:, None]", "return table / table.sum()",
          "normalise each row"),
         ("top_p", "return out / out.sum()", "return out", "renormalise the kept mass")]


@pytest.mark.parametrize(("gate", "old", "new", "named"), SLIPS)
def test_each_slip_is_named(gate, old, new, named):
    assert old in READER[gate]
    function = next(f[gate] for f in FUNCTIONS.values() if gate in f)
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[function])
    assert not result and named in repr(result), repr(result)


@pytest.mark.parametrize(("gate", "old", "new"), [
    ("mse_grad", "return np.array([2 * np.mean(error * x), 2 * np.mean(error)])",
     "return np.array([2 * np.mean(error * x), 2 * np.mean(error * x)])"),
    ("fit_line", "return w, y_bar - w * x_bar", "return w, y_bar"),
    ("numerical_gradient", "(2 * eps)", "(2.2 * eps)"),
    ("momentum", "theta -= lr * v", "theta -= lr * v * 0.9"),
    ("broadcast_shape", "out.append(max(p, q))", "out.append(min(p, q))"),
    ("tiled_reads", "return a_loads + b_loads", "return a_loads + b_loads + 1"),
    ("bigram_probs", "np.zeros((vocab_size, vocab_size)) + alpha", "np.zeros((vocab_size, vocab_size)) + alpha + 0.1"),
    ("top_p", "if mass >= p - 1e-12:", "if mass >= p / 2:"),
])
def test_a_wrong_answer_the_gate_has_no_name_for_still_fails(gate, old, new):
    assert old in READER[gate]
    function = next(f[gate] for f in FUNCTIONS.values() if gate in f)
    result = getattr(mastery, f"check_{gate}")(_run([READER[gate].replace(old, new)])[function])
    assert not result and not result.first and " -- " not in repr(result), repr(result)


@pytest.mark.serial
@pytest.mark.parametrize("module", [1, 2, 3, pytest.param(5, marks=pytest.mark.slow)])  # module 5 trains for 40 s
def test_the_notebook_goes_on_with_the_readers_code_once_it_passes(module):
    # module 5 stops before its scaling sweeps, which use none of the reader's code
    until = "## Scaling: a toy sweep" if module == 5 else None
    everything = run_with_answers(NOTEBOOKS[module], READER, CALLS[module], until=until)
    trained_with = {1: ["mse_grad"], 2: ["numerical_gradient"], 3: ["broadcast_shape"],
                    5: ["bigram_probs", "top_p_distribution"]}[module]
    for name in trained_with:
        assert f"Your {name} passed its gate: the cells below run yours." in everything
    if until is None:
        assert f"Module {module}: {len(CALLS[module])} of {len(CALLS[module])} gates passed" in everything
    else:
        assert record.load() == set(FUNCTIONS[module])
