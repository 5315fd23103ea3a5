"""The serving chapter's models: paged KV allocation, batching schedulers, quantization, the roofline."""

import pytest
import torch

from posttrainllm import batching, paged_kv, quantize, roofline
from posttrainllm.model import GPT, GPTConfig


def test_block_allocator_takes_blocks_as_tokens_arrive_and_returns_them():
    pool = paged_kv.BlockAllocator(num_blocks=4, block_size=2)
    pool.append(7, 3)
    assert pool.tables[7] == [0, 1] and pool.used_slots == 3 and pool.reserved_slots == 4
    pool.append(7)
    assert pool.tables[7] == [0, 1]  # the fourth token fills the second block
    assert [pool.slot(7, p) for p in range(4)] == [0, 1, 2, 3]
    pool.append(8, 1)
    pool.release(7)
    assert sorted(pool.free) == [0, 1, 3] and pool.tables == {8: [2]}
    with pytest.raises(paged_kv.OutOfBlocks, match="request 8 needs 4 more block"):
        pool.append(8, 8)
    assert pool.lengths[8] == 1  # a failed append takes nothing
    with pytest.raises(KeyError, match="request 7 holds no blocks"):
        pool.release(7)
    with pytest.raises(IndexError, match="request 8 has no token 1"):
        pool.slot(8, 1)


def test_simulation_counts_the_contiguous_waste_exactly():
    trace = [paged_kv.Request(prompt=4, output=2, max_output=8)] * 3
    run = paged_kv.simulate(trace, pool_tokens=24, block_size=None)  # two reservations of 12 fit at once
    assert run.steps == 4 and run.mean_running == 1.5 and run.preemptions == 0
    assert run.utilisation == pytest.approx((5 / 12 + 6 / 12 + 5 / 12 + 6 / 12) / 4)
    paged = paged_kv.simulate(trace, pool_tokens=24, block_size=2)
    assert paged.steps == 2 and paged.utilisation == pytest.approx(((5 + 5 + 5) / 18 + 1.0) / 2)


def test_paging_preempts_instead_of_failing_and_still_serves_everyone():
    trace = paged_kv.request_trace(30, seed=1, max_output=64)
    run = paged_kv.simulate(trace, pool_tokens=512, block_size=16)
    assert run.steps >= max(r.output for r in trace) and run.preemptions > 0
    with pytest.raises(ValueError, match="more than the whole pool"):
        paged_kv.simulate([paged_kv.Request(600, 1, 1)], pool_tokens=512, block_size=16)


def test_static_batches_wait_for_their_longest_request_and_continuous_ones_do_not():
    trace = [batching.Arrival(0.0, 1), batching.Arrival(0.0, 3), batching.Arrival(0.5, 1)]
    static = batching.static(trace, max_batch=4, step_seconds=lambda b: 1.0)
    continuous = batching.continuous(trace, max_batch=4, step_seconds=lambda b: 1.0)
    # static: the first two return together at t=3; the third starts then and returns at t=4
    assert static.p50_s == 3.0 and static.useful == 5 / 7 and static.tokens_per_s == 5 / 4
    # continuous: the first returns at t=1; the third joins at t=1 and returns at t=2; the second at t=3
    assert continuous.p50_s == 1.5 and continuous.useful == 1.0 and continuous.tokens_per_s == 5 / 3


def test_quantize_round_trips_within_half_a_step_and_packs_int4():
    w = torch.randn(6, 64, dtype=torch.float64)
    for bits, group in ((8, 64), (4, 32), (4, 16)):
        q, scales = quantize.quantize(w, bits, group)
        assert q.dtype == torch.int8 and q.int().abs().max() <= 2 ** (bits - 1)
        step = scales.repeat_interleave(group, 1)
        assert ((quantize.dequantize(q, scales, group) - w).abs() <= step / 2 + 1e-12).all()
    q, _ = quantize.quantize(w, 4, 32)
    packed = quantize.pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 32)
    assert torch.equal(quantize.unpack_int4(packed), q)
    with pytest.raises(ValueError, match="do not split into groups of 48"):
        quantize.quantize(w, 4, 48)


def test_quantized_model_replaces_block_linears_and_stores_fewer_bytes():
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=32))
    small = quantize.quantize_model(model, 4, 32)
    assert not any(isinstance(m, torch.nn.Linear) for m in small.blocks.modules())
    assert any(isinstance(m, torch.nn.Linear) for m in model.blocks.modules())  # the original is untouched
    assert quantize.stored_bytes(small.blocks) < quantize.stored_bytes(model.blocks) / 4
    idx = torch.randint(32, (2, 8))
    assert (small(idx) - model(idx)).abs().max() < 0.1


def test_roofline_bounds_and_measurements():
    roof = roofline.Roof(peak_flops=100.0, bandwidth=10.0)
    assert roof.ridge == 10 and roof.attainable(2) == 20 and roof.attainable(50) == 100
    assert roofline.matmul_rate(32, repeats=1) > 0 and roofline.read_bandwidth(4, repeats=1) > 0
