import numpy as np
import pytest

from posttrainllm import precision as fp


@pytest.mark.parametrize(
    "value, bits, kind",
    [
        (1.0, "0 01111 0000000000", "normal"),
        (-2.0, "1 10000 0000000000", "normal"),
        (65504.0, "0 11110 1111111111", "normal"),
        (65520.0, "0 11111 0000000000", "inf"),
        (2.0**-24, "0 00000 0000000001", "subnormal"),
        (2.0**-26, "0 00000 0000000000", "zero"),
    ],
)
def test_fp16_fields_decode_the_ieee_layout(value, bits, kind):
    fields = fp.fp16_fields(value)
    assert fields.bits == bits and fields.kind == kind


def test_rebuilding_from_fields_matches_numpy_for_every_finite_fp16():
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)]
    rebuilt = np.array([fp.fp16_value(fp.fp16_fields(float(x))) for x in finite[::7]])
    np.testing.assert_array_equal(rebuilt, finite[::7].astype(np.float64))


def test_spacing_is_relative():
    assert fp.spacing(1.0) == 2**-10 and fp.spacing(1024.0) == 1.0 and fp.spacing(32768.0) == 32.0


def test_a_running_fp16_total_stalls_at_256_and_the_fixes_do_not():
    tenths = np.full(10_000, 0.1)
    assert fp.sum_sequential(tenths) == 256.0
    assert abs(fp.sum_kahan(tenths) - 1000) < 1 and abs(fp.sum_fp32_accumulate(tenths) - 1000) < 1


def test_loss_scaling_rescues_underflowing_gradients():
    grads = 2.0 ** np.random.default_rng(0).normal(-27, 4, 10_000)
    assert fp.underflow_fraction(grads) > 0.5 > 0.01 > fp.underflow_fraction(grads, 2**16)
    assert fp.underflow_fraction(np.zeros(3)) == 0.0
