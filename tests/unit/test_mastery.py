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
