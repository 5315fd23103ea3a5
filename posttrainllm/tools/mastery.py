"""Mastery gates: each notebook's exercise calls one of these with the learner's function.

A gate runs the function on a handful of cases, compares it with the package's reference, and
says precisely which case failed and how — like a patient teaching assistant, not an assert.
It never raises: the result prints as a report and is truthy only when every case passed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from posttrainllm import linear


@dataclass
class GateResult:
    gate: str
    failures: list[str] = field(default_factory=list)
    cases: int = 0

    @property
    def passed(self) -> bool:
        return not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        if self.passed:
            return f"PASSED {self.gate}: all {self.cases} cases match the reference."
        head = f"NOT YET {self.gate}: {len(self.failures)} of {self.cases} cases fail."
        return "\n".join([head, *(f"  - {f}" for f in self.failures)])


def _fmt(values) -> str:
    return np.array2string(np.asarray(values, dtype=float), precision=4, suppress_small=True)


def _call(fn: Callable, *args):
    """Run the learner's function; an exception becomes a message, not a crash."""
    try:
        return fn(*args), None
    except Exception as err:  # noqa: BLE001 - any learner error is reported, not raised
        return None, f"raised {type(err).__name__}: {err}"


def check_fit_line(fit_line: Callable[[np.ndarray, np.ndarray], tuple[float, float]]) -> GateResult:
    """Gate for module 1: ``fit_line(x, y) -> (w, b)``, the least-squares line in closed form."""
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


def check_backward_rule(op: Callable) -> GateResult:
    """Gate for module 4: ``op(x: Value) -> Value`` computing softplus, ``log(1 + e^x)``, with its
    own ``_backward``. Checked against :func:`softplus_reference` (which the tests check against
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
            if err:
                result.failures.append(f"{label}: {err}")
                continue
            if not isinstance(out, Value):
                result.failures.append(f"{label}: expected a Value, got {type(out).__name__}")
                continue
            out.backward()
            if abs(out.data - value) > 1e-10:
                result.failures.append(f"{label}: forward value {out.data:.6f}, expected {value:.6f}")
            elif abs(x.grad - grad) > 1e-10:
                result.failures.append(f"{label}: d/dx = {x.grad:.6f}, the answer is {grad:.6f}")
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
            hint = " -- did you renormalise the kept mass to 1?" if np.isclose(np.sum(got), p) else ""
            result.failures.append(f"{label} (p={p}): expected {_fmt(want)}, got {_fmt(got)}{hint}")
    return result


def check_merge_step(merge_step: Callable[[dict], tuple]) -> GateResult:
    """Gate for module 6: ``merge_step(words) -> (pair, new_words)``, one step of BPE training.

    ``words`` maps a tuple of token ids to its count. The step finds the most frequent adjacent
    pair (ties: the smallest pair), gives it id ``256 + number of merges so far`` — here always
    256 — and merges it in every word, left to right without overlaps.
    """
    from posttrainllm.tokenizer import merge_pair, pair_counts

    result = GateResult("merge_step")
    cases = [
        ("a simple count", {(104, 105): 3, (104, 97): 1}),
        ("counts weighted by word frequency", {(1, 2, 3): 1, (2, 3): 5, (1, 2): 2}),
        ("a tie: the smallest pair wins", {(5, 6): 2, (3, 4): 2}),
        ("an overlapping run: aaa merges once", {(97, 97, 97): 4, (98,): 1}),
    ]
    for label, words in cases:
        result.cases += 1
        counts = pair_counts(words)
        want_pair = min(counts, key=lambda p: (-counts[p], p))
        want_words = {tuple(merge_pair(list(w), want_pair, 256)): n for w, n in words.items()}
        got, err = _call(merge_step, dict(words))
        if err:
            result.failures.append(f"{label}: {err}")
        elif not (isinstance(got, tuple) and len(got) == 2):
            result.failures.append(f"{label}: expected (pair, new_words), got {got!r}")
        elif tuple(got[0]) != want_pair:
            result.failures.append(f"{label}: expected to merge {want_pair}, got {got[0]}")
        elif {tuple(k): v for k, v in got[1].items()} != want_words:
            result.failures.append(f"{label}: merged words should be {want_words}, got {got[1]}")
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
        peak, total = -np.inf, 0.0
        try:
            for value in x:
                peak, total = update(peak, total, float(value))
        except Exception as err:  # noqa: BLE001 - reported, not raised
            result.failures.append(f"{label}: raised {type(err).__name__}: {err}")
            continue
        want_peak = float(x.max())
        want_total = float(np.exp(x - want_peak).sum())
        if not (np.isclose(peak, want_peak) and np.isclose(total, want_total, rtol=1e-9)):
            hint = " -- rescale the running sum by exp(old max - new max)" if np.isclose(peak, want_peak) else ""
            result.failures.append(
                f"{label}: ended at (max {peak:.4g}, sum {total:.6g}), "
                f"expected ({want_peak:.4g}, {want_total:.6g}){hint}"
            )
    return result


def check_adamw_update(update: Callable) -> GateResult:
    """Gate for module 8: ``update(w, g, m, v, t, lr, betas, eps, weight_decay) -> (w, m, v)``,
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
