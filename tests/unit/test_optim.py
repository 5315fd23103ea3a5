import math

import numpy as np
import pytest
import torch

from posttrainllm import optim


def _pair(seed=0):
    """Two identical small nets (a matrix, a bias, a vector) and a fixed stream of losses."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    twin.load_state_dict(net.state_dict())
    return net, twin


def _run(net, optimizer, steps=100, seed=1):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=generator)
        loss = (net(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize(("ours", "theirs"), [(optim.AdamW, torch.optim.AdamW), (optim.Adam, torch.optim.Adam)])
def test_adam_and_adamw_match_torch_parameter_by_parameter_over_100_steps(ours, theirs, weight_decay):
    net, twin = _pair()
    _run(net, ours(net.parameters(), lr=1e-2, weight_decay=weight_decay))
    _run(twin, theirs(twin.parameters(), lr=1e-2, weight_decay=weight_decay, amsgrad=False))
    for (name, p), q in zip(net.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_matches_torch(momentum):
    net, twin = _pair()
    _run(net, optim.SGD(net.parameters(), lr=0.05, momentum=momentum))
    _run(twin, torch.optim.SGD(twin.parameters(), lr=0.05, momentum=momentum))
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_numpy_updates_agree_with_the_torch_optimizers():
    rng = np.random.default_rng(0)
    w0, grads = rng.standard_normal(7), rng.standard_normal((20, 7))
    for decoupled, cls in ((True, optim.AdamW), (False, optim.Adam)):
        w, m, v = w0.copy(), np.zeros(7), np.zeros(7)
        p = torch.tensor(w0, requires_grad=True)
        opt = cls([p], lr=0.01, weight_decay=0.1)
        for t, g in enumerate(grads, start=1):
            w, m, v = optim.adamw_update(w, g, m, v, t, lr=0.01, weight_decay=0.1, decoupled=decoupled)
            p.grad = torch.tensor(g)
            opt.step()
        np.testing.assert_allclose(w, p.detach().numpy(), atol=1e-12)
    w, buf = w0.copy(), None
    p = torch.tensor(w0, requires_grad=True)
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    for g in grads:
        w, buf = optim.sgd_momentum_update(w, g, buf, lr=0.1, momentum=0.9)
        p.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(w, p.detach().numpy(), atol=1e-12)


def test_adamw_decay_is_decoupled_from_the_gradient_scale():
    # with a zero gradient, AdamW still shrinks the weight by lr*wd each step; Adam's L2 decay
    # goes through the normalised update and moves it by about lr instead
    w = np.array([2.0])
    adamw, *_ = optim.adamw_update(w, np.zeros(1), np.zeros(1), np.zeros(1), 1, lr=0.1, weight_decay=0.01)
    adam, *_ = optim.adamw_update(w, np.zeros(1), np.zeros(1), np.zeros(1), 1, lr=0.1, weight_decay=0.01,
                                  decoupled=False)
    assert adamw[0] == pytest.approx(2.0 * (1 - 0.1 * 0.01))
    assert adam[0] == pytest.approx(2.0 - 0.1, abs=1e-6)


def test_warmup_cosine_matches_torch_schedulers_and_its_closed_form():
    max_lr, warmup, total, min_lr = 0.01, 10, 100, 0.001
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=max_lr)
    torch_sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LinearLR(opt, 1 / warmup, 1.0, total_iters=warmup - 1),
         torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=min_lr)],
        milestones=[warmup],
    )
    for step in range(total):
        assert optim.warmup_cosine(step, max_lr, warmup, total, min_lr) == pytest.approx(
            opt.param_groups[0]["lr"], rel=1e-6
        ), step
        opt.step()
        torch_sched.step()
    assert optim.warmup_cosine(warmup + (total - warmup) // 2, max_lr, warmup, total, min_lr) == pytest.approx(
        (max_lr + min_lr) / 2
    )
    assert optim.warmup_cosine(10_000, max_lr, warmup, total, min_lr) == min_lr


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clipping_matches_torch_clip_grad_norm(max_norm):
    net, twin = _pair()
    x = torch.randn(4, 6)
    for model in (net, twin):
        model(x).pow(2).sum().mul(10).backward()
    ours = optim.clip_grad_norm(net.parameters(), max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(twin.parameters(), max_norm).item()
    assert ours == pytest.approx(theirs, rel=1e-6)
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    after = math.sqrt(sum(p.grad.pow(2).sum().item() for p in net.parameters()))
    assert after == pytest.approx(min(ours, max_norm), rel=1e-5)


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="betas"):
        optim.AdamW([torch.nn.Parameter(torch.zeros(1))], betas=(0.9, 1.5))


def test_adamw_gate_passes_the_reference_and_names_each_classic_slip():
    from posttrainllm.tools import mastery

    def reference(w, g, m, v, t, lr, betas, eps, wd):
        return optim.adamw_update(w, g, m, v, t, lr, betas, eps, wd)

    def no_bias_correction(w, g, m, v, t, lr, betas, eps, wd):
        b1, b2 = betas
        w = w * (1 - lr * wd)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        return w - lr * m / (np.sqrt(v) + eps), m, v

    def coupled_decay(w, g, m, v, t, lr, betas, eps, wd):
        return optim.adamw_update(w, g, m, v, t, lr, betas, eps, wd, decoupled=False)

    def broken(*args):
        raise RuntimeError("not written yet")

    assert mastery.check_adamw_update(reference)
    assert len(mastery.check_adamw_update(no_bias_correction).failures) == 4
    failures = mastery.check_adamw_update(coupled_decay).failures
    assert len(failures) == 2 and all("weight decay" in f or "sizes" in f for f in failures)
    assert "not written yet" in repr(mastery.check_adamw_update(broken))
