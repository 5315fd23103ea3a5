import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import nn
from posttrainllm.autograd import Value
from posttrainllm.tensor import Tensor, mlp_forward, unbroadcast
from posttrainllm.toydata import make_moons


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6), k=st.integers(1, 5), m=st.integers(2, 5),
    bias_shape=st.sampled_from(["row", "vector", "scalar"]), seed=st.integers(0, 10_000),
)
def test_tensor_gradients_match_pytorch_with_broadcasting(n, k, m, bias_shape, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((n, k)), rng.standard_normal((k, m))
    b = {"row": rng.standard_normal((1, m)), "vector": rng.standard_normal(m), "scalar": rng.standard_normal(())}[
        bias_shape
    ]
    targets = rng.integers(0, m, n)

    def program(x, w, b, ce):
        h = x @ w + b
        shared = h.tanh()
        return (shared * shared + h.relu() * 0.5 - shared).sum() * 0.1 + ce(shared * 2.0 + h, targets)

    ours = [Tensor(v) for v in (x, w, b)]
    program(*ours, lambda logits, t: logits.cross_entropy(t)).backward()
    theirs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, b)]
    program(*theirs, lambda logits, t: torch.nn.functional.cross_entropy(logits, torch.tensor(t))).backward()
    for o, t in zip(ours, theirs, strict=True):
        assert o.grad.shape == o.data.shape
        np.testing.assert_allclose(o.grad, t.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_unbroadcast_sums_stretched_axes_back():
    assert unbroadcast(np.ones((4, 3)), (3,)).tolist() == [4.0, 4.0, 4.0]
    assert unbroadcast(np.ones((2, 4, 3)), (4, 1)).shape == (4, 1)
    assert unbroadcast(np.ones((2, 3)), ()).item() == 6.0


def test_scalar_mlp_tensor_mlp_and_torch_agree_on_loss_and_gradients():
    x, y = make_moons(n=12, seed=3)
    net = nn.MLP([2, 5, 4, 3], activation="relu", seed=2)
    y = y + (np.arange(12) % 3 == 0)  # three classes
    loss = sum((nn.cross_entropy(net(list(map(float, xi))), int(t)) for xi, t in zip(x, y, strict=True)), Value(0.0))
    (loss * (1 / 12)).backward()
    params = [(Tensor(w), Tensor(b)) for w, b in net.weights()]
    t_loss = mlp_forward(Tensor(x), params, activation="relu").cross_entropy(y)
    t_loss.backward()
    assert t_loss.data.item() == pytest.approx(loss.data / 12, rel=1e-12)
    first = np.array([[n.w[i].grad for n in net.layers[0].neurons] for i in range(2)])
    np.testing.assert_allclose(first, params[0][0].grad, atol=1e-12)
    torch_params = [tuple(torch.tensor(v, requires_grad=True) for v in wb) for wb in net.weights()]
    h = torch.tensor(x)
    for i, (w, b) in enumerate(torch_params):
        h = h @ w + b
        h = torch.relu(h) if i < 2 else h
    torch.nn.functional.cross_entropy(h, torch.tensor(y)).backward()
    np.testing.assert_allclose(params[-1][1].grad, torch_params[-1][1].grad.numpy(), atol=1e-12)


def test_zero_grad_and_parameter_count():
    net = nn.MLP([2, 3, 2], seed=0)
    assert len(net.parameters()) == (2 * 3 + 3) + (3 * 2 + 2)
    nn.cross_entropy(net([0.5, -0.5]), 1).backward()
    assert any(p.grad for p in net.parameters())
    net.zero_grad()
    assert all(p.grad == 0 for p in net.parameters())


def test_same_seed_same_network():
    assert [w.tolist() for w, _ in nn.MLP([2, 4, 2], seed=5).weights()] == [
        w.tolist() for w, _ in nn.MLP([2, 4, 2], seed=5).weights()
    ]


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda: nn.MLP([2, 3], activation="gelu"), ValueError, "activation must be one of"),
        (lambda: nn.MLP([2]), ValueError, "input and output sizes"),
        (lambda: nn.MLP([2, 2])([1.0]), ValueError, "takes 2 inputs, got 1"),
        (lambda: nn.cross_entropy([Value(0.0), Value(1.0)], 2), ValueError, "not a class index"),
        (lambda: Tensor([1.0, 2.0]) + "x", TypeError, "unsupported operand for Tensor"),
        (lambda: Tensor([1.0, 2.0]).backward(), ValueError, "scalar output"),
        (lambda: Tensor(np.ones((2, 3))) @ Tensor(np.ones((2, 3))), ValueError, r"\(2, 3\) @ \(2, 3\)"),
        (lambda: Tensor([float("nan")]), ValueError, "NaN"),
        (lambda: Tensor(np.ones((2, 2))).cross_entropy([0, 5]), ValueError, "class indices"),
        (lambda: make_moons(1), ValueError, "at least 2 points"),
    ],
)
def test_bad_input_is_refused_with_a_reason(bad, error, message):
    with pytest.raises(error, match=message):
        bad()


def test_moons_are_reproducible_and_balanced():
    x1, y1 = make_moons(101, seed=4)
    x2, y2 = make_moons(101, seed=4)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert x1.shape == (101, 2) and sorted(set(y1.tolist())) == [0, 1] and y1.sum() == 51
