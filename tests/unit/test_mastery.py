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
