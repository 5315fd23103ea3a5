import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import gradient_descent as gd
from posttrainllm import linear


def test_data_is_reproducible_from_its_seed():
    a, b = linear.make_line_data(seed=3), linear.make_line_data(seed=3)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    assert not np.array_equal(a[0], linear.make_line_data(seed=4)[0])


def test_mse_worked_example():
    assert linear.mse(np.array([1.0, 2.0]), np.array([1.0, 4.0])) == 2.0


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 200), slope=st.floats(-50, 50), noise=st.floats(0, 5))
def test_closed_form_matches_numpy_polyfit(seed, n, slope, noise):
    x, y = linear.make_line_data(n=n, slope=slope, intercept=1.0, noise=noise, seed=seed)
    np.testing.assert_allclose(linear.fit_closed_form(x, y), np.polyfit(x, y, 1), rtol=1e-7, atol=1e-7)


def test_normal_equations_match_lstsq_with_several_features():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((50, 3))
    y = features @ np.array([1.0, -2.0, 0.5]) + 3.0 + 0.1 * rng.standard_normal(50)
    design = np.hstack([features, np.ones((50, 1))])
    np.testing.assert_allclose(
        linear.fit_normal_equations(features, y), np.linalg.lstsq(design, y, rcond=None)[0], atol=1e-10
    )


def test_gradient_at_the_closed_form_fit_is_zero():
    x, y = linear.make_line_data(seed=1)
    assert np.linalg.norm(linear.mse_grad(linear.fit_closed_form(x, y), x, y)) < 1e-10


def test_chain_rule_gradient_matches_central_differences():
    x, y = linear.make_line_data(seed=2)
    for theta in (np.array([0.0, 0.0]), np.array([3.0, -2.5])):
        np.testing.assert_allclose(
            linear.mse_grad(theta, x, y),
            gd.numerical_gradient(lambda t: linear.mse_loss(t, x, y), theta),
            atol=1e-7,
        )


def test_hessian_matches_differences_of_the_gradient():
    x, y = linear.make_line_data(seed=5)
    columns = [gd.numerical_gradient(lambda t, i=i: linear.mse_grad(t, x, y)[i], np.zeros(2)) for i in range(2)]
    np.testing.assert_allclose(linear.mse_hessian(x), np.array(columns), atol=1e-6)


def test_loss_surface_agrees_with_pointwise_loss():
    x, y = linear.make_line_data(seed=6)
    ws, bs = np.array([0.0, 1.0, 2.0]), np.array([-1.0, 0.5])
    surface = linear.loss_surface(x, y, ws, bs)
    assert surface.shape == (2, 3)
    assert surface[1, 2] == pytest.approx(linear.mse_loss(np.array([2.0, 0.5]), x, y))


@pytest.mark.parametrize(
    "x, y, message",
    [
        (np.full(4, 1.0), np.arange(4.0), "all x values are equal"),
        (np.arange(3.0), np.arange(4.0), "same length"),
    ],
)
def test_degenerate_inputs_say_what_is_wrong(x, y, message):
    with pytest.raises(ValueError, match=message):
        linear.fit_closed_form(x, y)


def test_dependent_features_are_refused():
    features = np.stack([np.arange(5.0), 2 * np.arange(5.0)], axis=1)
    with pytest.raises(ValueError, match="linearly dependent"):
        linear.fit_normal_equations(features, np.arange(5.0))
