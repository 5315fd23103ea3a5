import copy

import pytest
import torch
from torch.nn import functional as F

from posttrainllm.fused_cross_entropy import IGNORE_INDEX, linear_cross_entropy
from posttrainllm.model import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=300, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _head_case(dtype=torch.float64, ignored=5):
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(3, 16, 32, generator=generator, dtype=dtype, requires_grad=True)
    weight = torch.randn(300, 32, generator=generator, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, 300, (3, 16), generator=generator)
    targets[0, :ignored] = IGNORE_INDEX  # e.g. an SFT prompt
    return h, weight, targets


def _loss_and_grads(loss_fn, h, weight, targets):
    h, weight = h.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(h, weight, targets)
    (3.0 * loss).backward()  # an incoming gradient other than 1 must scale both
    return loss.detach(), h.grad, weight.grad


def _plain(h, weight, targets):
    return F.cross_entropy((h @ weight.T).flatten(0, 1), targets.flatten())


def test_the_loss_and_both_gradients_are_cross_entropys_of_the_head():
    h, weight, targets = _head_case()
    for got, want in zip(_loss_and_grads(linear_cross_entropy, h, weight, targets),
                         _loss_and_grads(_plain, h, weight, targets), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_an_ignored_target_adds_no_loss_no_gradient_and_is_not_counted():
    h, weight, targets = _head_case()
    loss, grad_h, _ = _loss_and_grads(linear_cross_entropy, h, weight, targets)
    assert torch.all(grad_h[0, :5] == 0) and torch.all(grad_h[0, 5:].abs().sum(-1) > 0)
    kept = targets != IGNORE_INDEX
    torch.testing.assert_close(loss, F.cross_entropy((h @ weight.T)[kept], targets[kept]).detach(), rtol=1e-12,
                               atol=0)


def test_under_bf16_autocast_it_drifts_from_float64_no_more_than_the_plain_head_does():
    h, weight, targets = _head_case()
    exact = _loss_and_grads(_plain, h, weight, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _loss_and_grads(linear_cross_entropy, h.float(), weight.float(), targets)
        plain = _loss_and_grads(_plain, h.float(), weight.float(), targets)
    for f, p, e in zip(fused, plain, exact, strict=True):
        drift_f, drift_p = (((t.double() - e).norm() / e.norm()).item() for t in (f, p))
        assert drift_p > 1e-4  # bf16 rounding shows: the comparison is not between float64 runs
        assert drift_f < 2 * drift_p, (drift_f, drift_p)


def test_a_gpt_with_the_fused_loss_trains_like_the_plain_one_and_keeps_no_logits():
    plain = GPT(CONFIG).double()
    fused = copy.deepcopy(plain)
    fused.fused_loss = True
    generator = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, CONFIG.vocab_size, (4, 16), generator=generator) for _ in range(2))
    (logits, a), (none, b) = plain(x, y), fused(x, y)
    assert logits.shape == (4, 16, CONFIG.vocab_size) and none is None
    a.backward()
    b.backward()
    torch.testing.assert_close(b, a, rtol=1e-12, atol=0)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-14, msg=name)
    with torch.no_grad():  # evaluation keeps the plain path and its logits
        logits, loss = fused(x, y)
    assert logits.shape == (4, 16, CONFIG.vocab_size)
    torch.testing.assert_close(loss, a.detach(), rtol=1e-12, atol=0)


@pytest.mark.slow
def test_it_compiles_to_the_same_loss():
    model = GPT(CONFIG)
    model.fused_loss = True
    x, y = (torch.randint(0, CONFIG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(s)) for s in (2, 3))
    _, eager = model(x, y)
    _, compiled = torch.compile(model)(x, y)
    compiled.backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=0)
    assert all(p.grad is not None for p in model.parameters())


def test_targets_of_the_wrong_shape_are_named():
    h, weight, targets = _head_case()
    with pytest.raises(ValueError, match=r"needs targets of shape \(3, 16\), got \(48,\)"):
        linear_cross_entropy(h, weight, targets.flatten())
