import numpy as np
import pytest

from posttrainllm import gradient_descent as gd
from posttrainllm import linear

X, Y = linear.make_line_data(n=100, seed=0)
BEST = linear.fit_closed_form(X, Y)
START = np.array([-1.0, 2.0])


def loss(t):
    return linear.mse_loss(t, X, Y)


def grad(t):
    return linear.mse_grad(t, X, Y)


def batch_grad(t, idx):
    return grad(t) if idx is None else linear.mse_grad(t, X[idx], Y[idx])


def test_numerical_gradient_worked_example_and_second_order_accuracy():
    np.testing.assert_allclose(gd.numerical_gradient(lambda t: float(t @ t), np.array([1.0, -2.0])), [2, -4])
    theta = np.array([0.5, -1.0])
    err = [np.abs(gd.numerical_gradient(lambda t: float(np.exp(t).sum()), theta, eps=e) - np.exp(theta)).max()
           for e in (1e-2, 1e-3)]
    assert 50 < err[0] / err[1] < 200  # 10x smaller eps -> ~100x smaller error


def test_gradient_descent_reaches_the_closed_form_optimum():
    run = gd.gradient_descent(loss, grad, START, lr=0.1, steps=200)
    np.testing.assert_allclose(run.thetas[-1], BEST, atol=1e-8)
    assert not run.diverged and run.thetas.shape == (201, 2) and run.losses.shape == (201,)


def test_the_stability_limit_is_two_over_lambda_max():
    lr_max = gd.max_stable_lr(linear.mse_hessian(X))
    below = gd.gradient_descent(loss, grad, START, lr=0.98 * lr_max, steps=4000)
    above = gd.gradient_descent(loss, grad, START, lr=1.02 * lr_max, steps=4000)
    assert below.final_loss == pytest.approx(loss(BEST), abs=1e-9)
    assert above.diverged and len(above.losses) < 4001


def test_momentum_beats_plain_descent_on_an_ill_conditioned_valley():
    xs = X + 4.0

    def loss_s(t):
        return linear.mse_loss(t, xs, Y)

    def grad_s(t):
        return linear.mse_grad(t, xs, Y)

    target = loss_s(linear.fit_closed_form(xs, Y)) + 1e-6
    lr = 0.9 * gd.max_stable_lr(linear.mse_hessian(xs))
    plain = gd.steps_to_reach(gd.gradient_descent(loss_s, grad_s, START, lr=lr, steps=20000), target)
    heavy = gd.steps_to_reach(gd.gradient_descent(loss_s, grad_s, START, lr=lr / 5, steps=20000, momentum=0.9), target)
    assert heavy is not None and plain is not None and heavy < plain / 2


def test_sgd_is_reproducible_and_full_batch_sgd_is_gradient_descent():
    a = gd.sgd(loss, batch_grad, START, lr=0.05, steps=50, n_examples=100, batch_size=5, seed=7)
    b = gd.sgd(loss, batch_grad, START, lr=0.05, steps=50, n_examples=100, batch_size=5, seed=7)
    c = gd.sgd(loss, batch_grad, START, lr=0.05, steps=50, n_examples=100, batch_size=5, seed=8)
    assert np.array_equal(a.thetas, b.thetas) and not np.array_equal(a.thetas, c.thetas)
    full = gd.sgd(loss, batch_grad, START, lr=0.05, steps=50)
    np.testing.assert_array_equal(full.thetas, gd.gradient_descent(loss, grad, START, lr=0.05, steps=50).thetas)


def test_a_hotter_constant_learning_rate_settles_on_a_higher_noise_floor():
    lr_max = gd.max_stable_lr(linear.mse_hessian(X))
    floors = [
        np.mean(gd.sgd(loss, batch_grad, START, lr=f * lr_max, steps=3000, n_examples=100, batch_size=4,
                       seed=1).losses[-1000:]) - loss(BEST)
        for f in (0.3, 0.03)
    ]
    assert floors[0] > 3 * floors[1] > 0


def test_steps_to_reach():
    traj = gd.Trajectory(np.zeros((4, 1)), np.array([5.0, 3.0, 1.0, 0.5]), diverged=False)
    assert gd.steps_to_reach(traj, 1.0) == 2 and gd.steps_to_reach(traj, 0.1) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lr": 0.0}, "learning rate must be positive"),
        ({"lr": 0.1, "momentum": 1.0}, "momentum must be in"),
        ({"lr": 0.1, "n_examples": 100}, "both n_examples and batch_size"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gd.sgd(loss, batch_grad, START, steps=1, **kwargs)
