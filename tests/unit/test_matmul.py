import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import matmul as mm
from posttrainllm.tools import mastery

shapes = st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))


@settings(max_examples=40, deadline=None)
@given(shape=shapes, tile=st.sampled_from([1, 2, 4, 8, 16]), seed=st.integers(0, 1000))
def test_tiled_matmul_is_exact_and_its_loads_match_the_closed_form(shape, tile, seed):
    m, n, k = shape
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    out, traffic = mm.matmul_tiled(a, b, tile)
    np.testing.assert_allclose(out, a @ b, atol=1e-12)
    assert traffic.slow_reads == mm.tiled_slow_reads(m, n, k, tile)


def test_tiling_divides_slow_reads_by_the_tile_size_when_it_divides_the_matrix():
    a, b = np.ones((64, 32)), np.ones((32, 48))
    _, naive = mm.matmul_untiled(a, b)
    assert naive.slow_reads == 2 * 64 * 48 * 32
    for tile in (4, 8, 16):
        assert naive.slow_reads / mm.matmul_tiled(a, b, tile)[1].slow_reads == tile


@pytest.mark.parametrize("block", [1, 2, 4, 8])
def test_register_blocking_divides_fast_reads_by_the_block_and_keeps_slow_reads(block):
    rng = np.random.default_rng(block)
    a, b = rng.standard_normal((48, 40)), rng.standard_normal((40, 32))
    out, blocked = mm.matmul_register_blocked(a, b, tile=16, block=block)
    _, tiled = mm.matmul_tiled(a, b, tile=16)
    np.testing.assert_allclose(out, a @ b, atol=1e-12)
    assert blocked.slow_reads == tiled.slow_reads and tiled.fast_reads == block * blocked.fast_reads


def test_naive_triple_loop_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 3))
    np.testing.assert_allclose(mm.matmul_naive(a, b), a @ b, atol=1e-12)


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 2\)"):
        mm.matmul_tiled(np.ones((3, 4)), np.ones((5, 2)))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        mm.matmul_naive(np.ones((3, 4)), np.ones((5, 2)))
    with pytest.raises(ValueError, match="block must divide tile"):
        mm.matmul_register_blocked(np.ones((4, 4)), np.ones((4, 4)), tile=16, block=3)


def test_flops_bytes_and_roofline():
    assert mm.matmul_flops(2, 3, 4) == 48
    assert mm.matmul_min_bytes(2, 3, 4, itemsize=2) == 2 * (8 + 12 + 6)
    np.testing.assert_allclose(mm.roofline([0.1, 10, 1000], peak_gflops=100, bandwidth_gbs=20), [2, 100, 100])


def test_measurements_return_positive_rates():
    assert mm.measure_bandwidth_gbs(n_bytes=2**20, repeats=1) > 0
    assert mm.measure_matmul_gflops(32, repeats=1) > 0


def test_tiled_reads_gate_accepts_the_closed_form_and_explains_a_square_only_formula():
    assert mastery.check_tiled_reads(mm.tiled_slow_reads)
    result = mastery.check_tiled_reads(lambda m, n, k, t: 2 * m * n * k // t)
    assert len(result.failures) == 2 and all("partial" in f for f in result.failures)


def test_roofline_operations_count_their_flops_and_bytes_exactly():
    ops = mm.roofline_operations(n_vec=1000, n_mv=40, matmul_sizes=(6, 12))
    assert list(ops) == ["vector add", "dot product", "matrix-vector", "matmul 6", "matmul 12"]
    assert ops["vector add"].intensity == 1 / 12 and ops["dot product"].intensity == 1 / 4
    assert ops["matrix-vector"].intensity == 2 * 40**2 / (4 * (40**2 + 2 * 40))
    assert [ops[f"matmul {n}"].intensity for n in (6, 12)] == [1.0, 2.0]  # n / 6 for square fp32
    assert ops["matrix-vector"].run().shape == (40,) and ops["matmul 12"].run().shape == (12, 12)
    assert all(op.measure_gflops(repeats=1) > 0 for op in ops.values())
