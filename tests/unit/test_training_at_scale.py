"""ZeRO's memory count against real processes, and the simulated low-precision formats."""

import pytest
import torch

from posttrainllm import simulated_precision as sp
from posttrainllm import zero
from posttrainllm.model import GPT, GPTConfig


def test_zero_reproduces_the_papers_7_5b_example():
    totals = [zero.bytes_per_device(7.5e9, 64, stage)["total"] / 1e9 for stage in range(4)]
    assert totals == pytest.approx([120, 31.40625, 16.640625, 1.875])
    with pytest.raises(ValueError, match="stage must be one of"):
        zero.bytes_per_device(1, 2, 4)


def test_measured_bytes_per_process_match_the_count():
    config = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
    n = GPT(config).n_params()
    ranks = zero.measure(config, world_size=2, modes=("ddp", "fsdp"))
    for rank in ranks:
        assert sum(rank["ddp"].values()) == zero.bytes_per_device(n, 2, 0, 4, 4, 8)["total"]
        assert rank["fsdp"]["params"] <= n * 4 / 2 + 4 * 64  # a shard, up to FSDP's padding
    assert sum(r["fsdp"]["params"] for r in ranks) >= n * 4
    with pytest.raises(ValueError, match="unknown modes"):
        zero.measure(config, 2, modes=("zero2",))


def test_formats_describe_their_bits_and_range():
    e4m3, bf16 = sp.describe("e4m3"), sp.describe("bf16")
    assert (e4m3.exponent_bits, e4m3.mantissa_bits, e4m3.max) == (4, 3, 448.0)
    assert (bf16.exponent_bits, bf16.mantissa_bits) == (8, 7)
    assert sp.describe("fp16").smallest_subnormal == 2.0**-24


def test_cast_rounds_saturates_and_scales():
    x = torch.tensor([1.0, 1.06, 1000.0, 1e-4], dtype=torch.float64)
    assert sp.cast(x, "e4m3").tolist() == [1.0, 1.0, 448.0, 0.0]
    scaled = sp.cast(x[3:], "e4m3", scaled=True)
    assert scaled.item() == pytest.approx(1e-4, rel=0.07)  # scaled to the top of the range, kept
    assert torch.equal(sp.cast(x, "fp32"), x)
    with pytest.raises(ValueError, match="unknown format 'fp4'"):
        sp.cast(x, "fp4")


def test_simulated_linear_rounds_forward_and_backward():
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4).double()
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    simulated = sp.SimulatedLinear(linear, sp.Recipe("bf16", "e5m2"))
    out = simulated(x)
    expected = torch.nn.functional.linear(sp.cast(x, "bf16"), sp.cast(linear.weight, "bf16"), linear.bias)
    torch.testing.assert_close(out, expected)
    out.backward(torch.full_like(out, 1.1))  # 1.1 rounds to 1.0 in e5m2
    torch.testing.assert_close(linear.bias.grad, torch.full((4,), 3.0, dtype=torch.float64))


def test_simulate_wraps_every_linear_but_the_tied_head():
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16))
    simulated = sp.simulate(model, sp.Recipe("bf16", "bf16"))
    wrapped = [m for m in simulated.modules() if isinstance(m, sp.SimulatedLinear)]
    plain = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(wrapped) == len(plain) - 1 and isinstance(simulated.head, torch.nn.Linear)
