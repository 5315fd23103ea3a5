import pytest

from posttrainllm.measure import agreement


@pytest.mark.parametrize("error", [0.0, 4.4e-16, 2.7e-15, 9.99e-13])
def test_round_off_below_the_bound_prints_the_bound_not_its_digits(error):
    assert agreement(error, 1e-12) == "within 1e-12"


def test_an_error_above_the_bound_prints_itself_and_the_bound():
    assert agreement(2.0e-3, 1e-4) == "2.0e-03, above 1e-04"
    assert agreement(1e-12, 1e-12) == "1.0e-12, above 1e-12"  # the bound is strict, as the asserts are
