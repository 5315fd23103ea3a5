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


# --- module 7: the reader's GPT -----------------------------------------------------------
# Right answers, and for each gate the slips it must catch with the hint it must give.


def _attention(q, k, v, causal=True, scale=None, mask_upper=False, dim=-1):
    import torch

    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        t = scores.shape[-1]
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~(keep.T if mask_upper else keep), float("-inf"))
    return scores.softmax(dim) @ v


def _self_attention(x, layer, n_head, attend=_attention):
    b, t, c = x.shape
    q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in layer.qkv(x).split(c, dim=2))
    return layer.proj(attend(q, k, v).transpose(1, 2).reshape(b, t, c))


def _block(x, layer, n_head, act=None):
    import torch.nn.functional as F

    x = x + _self_attention(layer.norm1(x), layer.attn, n_head)
    return x + layer.mlp.proj((act or F.gelu)(layer.mlp.up(layer.norm2(x))))


def _gpt(model, idx, positions=True, final_norm=True):
    import torch

    x = model.tok_emb(idx) + (model.pos_emb(torch.arange(idx.shape[1])) if positions else 0)
    for layer in model.blocks:
        x = _block(x, layer, model.config.n_head)
    return model.head(model.norm(x) if final_norm else x)


def _hints(result) -> set[str]:
    return {failure.split(" -- ")[1] for failure in result.failures if " -- " in failure}


def test_attention_gate():
    assert mastery.check_attention(_attention)
    slips = {
        "not scaled": lambda q, k, v, c: _attention(q, k, v, c, scale=1.0),
        "not head_dim": lambda q, k, v, c: _attention(q, k, v, c, scale=1 / q.shape[-1]),
        "mask is missing": lambda q, k, v, c: _attention(q, k, v, False),
        "wrong way round": lambda q, k, v, c: _attention(q, k, v, c, mask_upper=True),
        "over the keys": lambda q, k, v, c: _attention(q, k, v, c, dim=-2),
    }
    for phrase, slip in slips.items():
        result = mastery.check_attention(slip)
        assert not result and any(phrase in hint for hint in _hints(result)), (phrase, result.failures)
    assert "got NoneType" in mastery.check_attention(lambda q, k, v, c: None).failures[0]
    assert "raised ZeroDivisionError" in mastery.check_attention(lambda q, k, v, c: 1 / 0).failures[0]


def test_self_attention_gate():
    assert mastery.check_self_attention(_self_attention)
    one_head = mastery.check_self_attention(lambda x, layer, n: _self_attention(x, layer, 1))
    assert len(one_head.failures) == 2 and all("heads of" in h for h in _hints(one_head))  # the 1-head case passes
    no_mask = mastery.check_self_attention(
        lambda x, layer, n: _self_attention(x, layer, n, lambda q, k, v: _attention(q, k, v, False)))
    assert len(no_mask.failures) == 3 and _hints(no_mask) == {
        "the mask is missing: position i must not see positions after i"}


def test_block_gate():
    import torch

    assert mastery.check_block(_block)
    assert "GELU" in " ".join(_hints(mastery.check_block(lambda x, layer, n: _block(x, layer, n, torch.relu))))

    def post_norm(x, layer, n_head):
        x = layer.norm1(x + _self_attention(x, layer.attn, n_head))
        return layer.norm2(x + layer.mlp(x))

    assert "post-norm" in " ".join(_hints(mastery.check_block(post_norm)))


def test_gpt_forward_gate_matches_the_package_model_and_names_what_is_missing():
    assert mastery.check_gpt_forward(_gpt)
    assert "position embeddings" in " ".join(_hints(mastery.check_gpt_forward(lambda m, i: _gpt(m, i, False))))
    assert "model.norm" in " ".join(_hints(mastery.check_gpt_forward(lambda m, i: _gpt(m, i, final_norm=False))))
    wrong_shape = mastery.check_gpt_forward(lambda m, i: _gpt(m, i)[:, -1])
    assert "expected shape (2, 10, 40)" in wrong_shape.failures[0]


def test_the_gates_leave_the_default_dtype_as_they_found_it():
    import torch

    before = torch.get_default_dtype()
    mastery.check_gpt_forward(_gpt)
    assert torch.get_default_dtype() == before


# --- the spine's gates: a right answer written here (not the gate's reference) passes, and each
# slip fails with its hint.


def _train_step(model, X, y, lr, sign=1.0, zero=True, mean=True):
    from posttrainllm import nn

    losses = [nn.cross_entropy(model([float(v) for v in x]), int(t)) for x, t in zip(X, y, strict=True)]
    loss = losses[0]
    for extra in losses[1:]:
        loss = loss + extra
    loss = loss * (1 / len(losses)) if mean else loss
    if zero:
        for p in model.parameters():
            p.grad = 0.0
    loss.backward()
    for p in model.parameters():
        p.data -= sign * lr * p.grad
    return loss.data


def test_train_step_gate():
    assert mastery.check_train_step(_train_step)
    assert _hints(mastery.check_train_step(lambda *a: _train_step(*a, sign=-1.0))) == {
        "the weights moved uphill: subtract lr * grad"}
    assert _hints(mastery.check_train_step(lambda *a: _train_step(*a, zero=False))) == {
        "gradients pile up across steps: zero them before backward()"}
    assert _hints(mastery.check_train_step(lambda *a: _train_step(*a, mean=False))) == {
        "average the loss over the batch"}
    assert "the weights never changed" in str(mastery.check_train_step(lambda m, X, y, lr: _train_step(m, X, y, 0.0)))


def _encode(ids, merges):
    from posttrainllm.tokenizer import merge_pair

    while True:
        known = [p for p in zip(ids, ids[1:]) if p in merges]  # noqa: B905
        if not known:
            return ids
        pair = min(known, key=merges.get)
        ids = merge_pair(ids, pair, merges[pair])


def test_encode_gate():
    from posttrainllm.tokenizer import merge_pair

    assert mastery.check_encode(_encode)

    def leftmost(ids, merges):
        while any(p in merges for p in zip(ids, ids[1:])):  # noqa: B905
            pair = next(p for p in zip(ids, ids[1:]) if p in merges)  # noqa: B905
            ids = merge_pair(ids, pair, merges[pair])
        return ids

    def once(ids, merges):
        known = [p for p in zip(ids, ids[1:]) if p in merges]  # noqa: B905
        return merge_pair(ids, min(known, key=merges.get), merges[min(known, key=merges.get)]) if known else ids

    assert _hints(mastery.check_encode(leftmost)) == {
        "merge the pair learned earliest (lowest id) first, wherever it is, not the leftmost"}
    assert "keep merging until no adjacent pair is in merges" in _hints(mastery.check_encode(once))
    assert not mastery.check_encode(lambda ids, merges: ids)


def _tile(peak, total, acc, s, v, fix_total=True, fix_acc=True, shift=True):
    new = np.maximum(peak, s.max(axis=1)) if shift else np.zeros_like(peak)
    p, fix = np.exp(s - new[:, None]), np.exp(peak - new) if shift else np.ones_like(peak)
    return new, total * (fix if fix_total else 1) + p.sum(1), acc * (fix[:, None] if fix_acc else 1) + p @ v


def test_flash_tile_gate():
    assert mastery.check_flash_tile(_tile)
    assert _hints(mastery.check_flash_tile(lambda *a: _tile(*a, fix_acc=False))) == {
        "rescale acc by exp(old peak - new peak) too, not only the running sum"}
    assert _hints(mastery.check_flash_tile(lambda *a: _tile(*a, fix_total=False))) == {
        "rescale the running sum by exp(old peak - new peak) when the peak grows"}
    with np.errstate(all="ignore"):
        unshifted = mastery.check_flash_tile(lambda *a: _tile(*a, shift=False))
    assert _hints(unshifted) == {"subtract the running peak before exp()"}


def _scaler(grads, scale, good, interval, skip=True, grow=True):
    grads = [np.asarray(g) / scale for g in grads]
    if not all(np.isfinite(g).all() for g in grads):
        return (None if skip else grads), scale / 2, 0
    good += 1
    if grow and good == interval:
        return grads, scale * 2, 0
    return grads, scale, good


def test_loss_scaling_gate():
    assert mastery.check_loss_scaling(_scaler)
    unskipped = mastery.check_loss_scaling(lambda *a: _scaler(*a, skip=False))
    assert len(unskipped.failures) == 3 and "must be skipped" in unskipped.failures[0]
    never_grows = mastery.check_loss_scaling(lambda *a: _scaler(*a, grow=False))
    assert "six good steps, growth every 3, step 3: scale 1024 after 3 good steps, expected scale 2048 after 0" in (
        never_grows.failures)
    assert "divided by the scale" in mastery.check_loss_scaling(lambda g, s, n, i: (g, s, n)).failures[0]


def test_dpo_loss_gate():
    import torch.nn.functional as F

    def dpo(pc, pr, rc, rr, beta):
        return F.softplus(-beta * ((pc - rc) - (pr - rr))).mean()

    assert mastery.check_dpo_loss(dpo)
    slips = {
        "measure each log-probability against the reference model's": lambda pc, pr, rc, rr, b: dpo(
            pc, pr, 0 * rc, 0 * rr, b),
        "the margin is the chosen log-ratio minus the rejected one": lambda pc, pr, rc, rr, b: dpo(pr, pc, rr, rc, b),
        "multiply the margin by beta": lambda pc, pr, rc, rr, b: dpo(pc, pr, rc, rr, 1.0),
        "average the loss over the pairs": lambda *a: dpo(*a) * len(a[0]),
    }
    for hint, slip in slips.items():
        assert hint in _hints(mastery.check_dpo_loss(slip)), hint


def test_lora_merge_gate():
    assert mastery.check_lora_merge(lambda W, A, B, alpha, r: W + (alpha / r) * B @ A)
    assert _hints(mastery.check_lora_merge(lambda W, A, B, alpha, r: W + B @ A)) == {
        "scale the update B @ A by alpha / r"}
    assert _hints(mastery.check_lora_merge(lambda W, A, B, alpha, r: (alpha / r) * B @ A)) == {
        "the merged weight keeps W and adds the update"}
    assert "expected W's (7, 3)" in mastery.check_lora_merge(lambda W, A, B, alpha, r: A.T @ B.T).failures[1]


def _sae_step(sae, x, l1, optimizer, weighted=True, zero=True):
    x_hat, f = sae(x)
    penalty = f * sae.W_dec.norm(dim=0) if weighted else f
    loss = ((x - x_hat) ** 2).sum(-1).mean() + l1 * penalty.sum(-1).mean()
    if zero:
        optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def test_sae_step_gate():
    assert mastery.check_sae_step(_sae_step)
    plain = mastery.check_sae_step(lambda *a: _sae_step(*a, weighted=False))
    assert len(plain.failures) == 2  # with l1 = 0 the weighting makes no difference
    assert _hints(plain) == {"weight each feature's L1 by its decoder column's norm"}
    assert _hints(mastery.check_sae_step(lambda *a: _sae_step(*a, zero=False))) == {
        "zero the gradients before backward()"}


def _verify(p, q, token, u):
    if u * q[token] < p[token]:
        return True, None
    leftover = np.clip(p - q, 0, None)
    return False, leftover / leftover.sum()


def test_verify_gate():
    assert mastery.check_verify(_verify)
    always = mastery.check_verify(lambda p, q, t, u: (True, None))
    assert any("accepted=True, expected False" in f for f in always.failures)
    assert any(f.startswith("the output distribution") for f in always.failures)
    unnormalised = mastery.check_verify(lambda p, q, t, u: (_verify(p, q, t, u)[0], np.clip(p - q, 0, None)))
    assert _hints(unnormalised) == {"renormalise max(0, p - q) to sum to 1"}
    resample_p = mastery.check_verify(lambda p, q, t, u: (_verify(p, q, t, u)[0], p))
    assert any(f.startswith("the output distribution") for f in resample_p.failures)


def test_mse_grad_gate():
    def grad(theta, x, y, factor=2.0, mean=True):
        r = theta[0] * x + theta[1] - y
        total = np.array([(factor * r * x).sum(), (factor * r).sum()])
        return total / len(x) if mean else total

    assert mastery.check_mse_grad(grad)
    assert _hints(mastery.check_mse_grad(lambda t, x, y: grad(t, x, y, factor=1.0))) == {
        "the square's derivative brings a factor 2"}
    assert _hints(mastery.check_mse_grad(lambda t, x, y: grad(t, x, y, mean=False))) == {
        "the loss is a mean, so its gradient is divided by n"}
    assert "flipped" in str(mastery.check_mse_grad(lambda t, x, y: -grad(t, x, y)))


def test_momentum_gate():
    def descend(grad, theta, lr, momentum, steps, carry=True):
        velocity = np.zeros_like(theta)
        for _ in range(steps):
            velocity = (momentum * velocity if carry else 0) + grad(theta)
            theta = theta - lr * velocity
        return theta

    assert mastery.check_momentum(descend)
    forgets = mastery.check_momentum(lambda *a: descend(*a, carry=False))
    assert len(forgets.failures) == 2 and _hints(forgets) == {"the velocity must carry over from step to step"}


def test_broadcast_shape_gate():
    def broadcast_shape(a, b, from_right=True):
        n = max(len(a), len(b))
        pad = (lambda s: (1,) * (n - len(s)) + tuple(s)) if from_right else (lambda s: tuple(s) + (1,) * (n - len(s)))
        out = []
        for i, j in zip(pad(a), pad(b), strict=True):
            if i != j and 1 not in (i, j):
                raise ValueError(f"{a} and {b} do not broadcast")
            out.append(max(i, j))
        return tuple(out)

    assert mastery.check_broadcast_shape(broadcast_shape)
    left = mastery.check_broadcast_shape(lambda a, b: broadcast_shape(a, b, from_right=False))
    assert not left and all("align the shapes from the right" in f for f in left.failures)
    assert "raise ValueError" in str(mastery.check_broadcast_shape(lambda a, b: a if len(a) >= len(b) else b))


def test_bigram_probs_gate():
    def bigram_probs(ids, vocab_size, alpha):
        counts = np.full((vocab_size, vocab_size), float(alpha))
        for a, b in zip(ids[:-1], ids[1:], strict=True):
            counts[a, b] += 1
        return counts / counts.sum(axis=1, keepdims=True)

    assert mastery.check_bigram_probs(bigram_probs)
    assert _hints(mastery.check_bigram_probs(lambda *a: bigram_probs(*a).T)) == {
        "row a is what follows a: P[a, b] counts a then b"}
    assert "normalise each row" in str(mastery.check_bigram_probs(lambda *a: bigram_probs(*a) * 2))


# --- find-out gates: the right number passes, a wrong one is called too high or too low, and the
# number itself is never printed.


def test_find_out_gates_pass_the_truth_and_say_which_way_a_wrong_answer_is():
    from posttrainllm import linear, sampling, speculative
    from posttrainllm.matmul import tiled_slow_reads

    x, y = linear.make_line_data(n=30, slope=1.5, intercept=0.5, seed=11)
    best = linear.mse(linear.predict(linear.fit_closed_form(x, y), x), y)
    logits = np.array([2.0, 1.0, 0.0, -1.0])

    def entropy_bits(t):
        p = sampling.next_token_distribution(logits, temperature=t)
        return float(-(p * np.log2(p)).sum())

    ts = np.geomspace(0.05, 50, 20001)
    temperature = ts[np.argmin([abs(entropy_bits(t) - 1.5) for t in ts])]
    alphas = np.linspace(0, 1, 100001)
    alpha = alphas[np.argmin([abs(speculative.expected_tokens_per_forward(a, 4) - 3.0) for a in alphas])]
    tile = min(t for t in range(1, 97) if tiled_slow_reads(96, 80, 64, t) <= 50_000)
    rng = np.random.default_rng(0)
    delta = rng.standard_normal((8, 3)) @ np.diag([5.0, 2.0, 0.5]) @ rng.standard_normal((3, 12))
    sigma = np.linalg.svd(delta, compute_uv=False)
    rank = 1 + int(np.argmax(np.cumsum(sigma**2) / np.sum(sigma**2) >= 0.9))
    curvature = linear.mse_hessian(x)
    grads = np.array([1e-3, 2.0, -30.0])  # the largest is 30: 30 * 2^11 = 61440 < 65504 < 30 * 2^12
    right = {
        "lowest_loss": (lambda a: mastery.check_lowest_loss(a, x, y), best),
        "divergence_lr": (lambda a: mastery.check_divergence_lr(a, x, 0.9), 3.8 / np.linalg.eigvalsh(curvature)[-1]),
        "best_tile": (lambda a: mastery.check_best_tile(a, 96, 80, 64, 50_000), tile),
        "temperature": (lambda a: mastery.check_temperature(a, logits, 1.5), temperature),
        "max_loss_scale": (lambda a: mastery.check_max_loss_scale(a, grads), 2.0**11),
        "energy_rank": (lambda a: mastery.check_energy_rank(a, delta, 0.9), rank),
        "alpha_for": (lambda a: mastery.check_alpha_for(a, 4, 3.0), alpha),
    }
    for name, (gate, truth) in right.items():
        assert gate(truth), name
        assert repr(gate(truth)) == f"PASSED {name}: your answer matches."
        high, low = gate(truth * 1.5), gate(truth / 1.5 if truth > 1 else truth * 0.5)
        assert "too high" in high.failures[0] and "too low" in low.failures[0], name
        assert f"{truth:g}" not in repr(high), name
        assert "expected a number" in gate("many").failures[0]
    # the book's answers, run with record=False, do not call themselves the reader's
    assert repr(mastery.check_lowest_loss(best, x, y, record=False)) == "PASSED lowest_loss: the book's answer matches."


def test_graph_size_and_compression_and_memory_gates_measure_for_themselves():
    from posttrainllm.autograd import Value
    from posttrainllm.tokenizer import Tokenizer

    a, b = Value(2.0), Value(3.0)
    loss = (a * b + a).tanh()  # a, b, a*b, a*b + a, tanh: five nodes
    assert mastery.check_graph_size(5, loss) and not mastery.check_graph_size(6, loss)
    text, held_out = "the cat sat on the mat. " * 30, "the hat sat on the cat."
    tok = Tokenizer.train(text, 300)
    ratio = len(held_out.encode()) / len(tok.encode_ordinary(held_out))
    assert mastery.check_compression(ratio, text, held_out, 300)
    assert not mastery.check_compression(1.0, text, held_out, 300)
    assert not mastery.check_fa2_memory_ratio(1.0, 256, 32)  # naive needs far more than FA2


def test_expected_tokens_gate():
    def expected(alpha, k):
        return float(sum(alpha**i for i in range(k + 1)))  # P(at least i tokens) summed, bonus included

    assert mastery.check_expected_tokens(expected)
    no_bonus = mastery.check_expected_tokens(lambda a, k: float(sum(a**i for i in range(k))))
    assert "count the bonus token" in str(no_bonus)
    measured = {4: (0.8, expected(0.8, 4) * 0.95)}  # a run a little under the formula passes
    assert mastery.check_expected_tokens(expected, measured)
    assert "measured run k=4" in str(mastery.check_expected_tokens(expected, {4: (0.8, 1.5)}))
