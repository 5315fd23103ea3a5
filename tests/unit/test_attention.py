import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import attention as att
from posttrainllm.tools import mastery


def _qkv(seed, shape, m=None):
    rng = np.random.default_rng(seed)
    kv_shape = shape if m is None else (*shape[:-2], m, shape[-1])
    return rng.standard_normal(shape), rng.standard_normal(kv_shape), rng.standard_normal(kv_shape)


def _torch_reference(q, k, v, causal, dout=None, mask=None):
    tq, tk, tv = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=None if mask is None else torch.tensor(mask), is_causal=causal
    )
    if dout is None:
        return out.detach().numpy(), None
    out.backward(torch.tensor(dout))
    return out.detach().numpy(), (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())


@pytest.mark.parametrize("shape", [(5, 8), (2, 7, 4), (2, 3, 9, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention_matches_torch_sdpa_in_3d_and_4d(shape, causal):
    q, k, v = _qkv(0, shape)
    np.testing.assert_allclose(att.attention(q, k, v, causal=causal), _torch_reference(q, k, v, causal)[0], atol=1e-12)


def test_boolean_mask_matches_torch():
    q, k, v = _qkv(1, (2, 6, 4), m=5)
    mask = np.random.default_rng(2).random((6, 5)) > 0.3
    mask[:, 0] = True  # every query may see at least one key
    np.testing.assert_allclose(att.attention(q, k, v, mask=mask), _torch_reference(q, k, v, False, mask=mask)[0],
                               atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 70), d=st.sampled_from([1, 4, 8, 16]), causal=st.booleans(),
    block_q=st.sampled_from([1, 7, 16, 32]), block_k=st.sampled_from([1, 5, 16, 64]), seed=st.integers(0, 1000),
)
def test_fa2_forward_lse_and_gradients_match_torch_for_any_length_and_blocks(n, d, causal, block_q, block_k, seed):
    q, k, v = _qkv(seed, (2, 2, n, d))
    dout = np.random.default_rng(seed + 1).standard_normal((2, 2, n, d))
    ref_out, ref_grads = _torch_reference(q, k, v, causal, dout)
    out, lse = att.flash_attention_forward(q, k, v, causal, block_q, block_k)
    np.testing.assert_allclose(out, ref_out, atol=1e-10)
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    if causal:
        scores = np.where(att.causal_mask(n), scores, -np.inf)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), atol=1e-10)
    grads = att.flash_attention_backward(q, k, v, out, lse, dout, causal, block_q, block_k)
    for ours, theirs in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-9)


def test_fa2_in_fp32_is_within_fp32_tolerance_of_torch():
    q, k, v = (t.astype(np.float32) for t in _qkv(3, (1, 4, 100, 64)))
    out, _ = att.flash_attention_forward(q, k, v, causal=True)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, _torch_reference(q, k, v, True)[0], atol=2e-6)


def test_the_torch_function_saves_only_output_and_logsumexp_and_gives_sdpa_gradients():
    q, k, v = (torch.tensor(t, requires_grad=True) for t in _qkv(4, (2, 3, 33, 8)))
    out = att.flash_attention(q, k, v, causal=True)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved[3:]] == [(2, 3, 33, 8), (2, 3, 33)]  # output and logsumexp
    out.sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True).sum().backward()
    for a, b in [(q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)]:
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_multi_head_attention_matches_torch_multihead_attention():
    rng = np.random.default_rng(5)
    c, heads, n = 16, 4, 7
    x = rng.standard_normal((2, n, c))
    wq, wk, wv, wo = (rng.standard_normal((c, c)) / 4 for _ in range(4))
    mha = torch.nn.MultiheadAttention(c, heads, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.tensor(np.concatenate([wq.T, wk.T, wv.T])))
        mha.out_proj.weight.copy_(torch.tensor(wo.T))
    xt = torch.tensor(x)
    ref, _ = mha(xt, xt, xt, attn_mask=torch.tensor(~att.causal_mask(n)), need_weights=False)
    np.testing.assert_allclose(att.multi_head_attention(x, wq, wk, wv, wo, heads), ref.detach().numpy(), atol=1e-12)


def test_online_softmax_reads_the_input_twice_where_safe_softmax_reads_it_three_times():
    x = np.random.default_rng(6).standard_normal(50) * 10
    safe, safe_reads = att.safe_softmax_passes(x)
    online, online_reads = att.online_softmax_passes(x)
    np.testing.assert_allclose(online, safe, atol=1e-15)
    np.testing.assert_allclose(online, att.softmax(x), atol=1e-15)
    assert (safe_reads, online_reads) == (3 * 50, 2 * 50)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: att.attention(np.ones((4, 8)), np.ones((4, 6)), np.ones((4, 6))), r"\(4, 8\), k \(4, 6\)"),
        (lambda: att.attention(np.ones((2, 4, 8)), np.ones((4, 8)), np.ones((4, 8))), "same rank"),
        (lambda: att.flash_attention_forward(np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 4)), causal=True),
         "as many queries as keys"),
        (lambda: att.flash_attention_forward(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), block_q=0),
         "block size"),
        (lambda: att.multi_head_attention(np.ones((2, 6)), *(np.ones((6, 6)),) * 4, n_heads=4), "do not split"),
    ],
)
def test_bad_shapes_raise_errors_that_name_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_online_softmax_gate_accepts_the_recurrence_and_catches_a_missing_rescale():
    assert mastery.check_online_softmax_update(att.online_softmax_update)

    def no_rescale(peak, total, value):
        new = max(peak, value)
        return new, total + math.exp(value - new)

    failures = mastery.check_online_softmax_update(no_rescale).failures
    assert failures and all("rescale" in f for f in failures)
