import dataclasses

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from posttrainllm.checkpointing import ActivationMeter, recompute
from posttrainllm.model import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=40, block_size=16, n_layer=4, n_head=2, n_embd=16)


def _loss_and_grads(model, idx):
    model.zero_grad()
    _, loss = model(idx, idx)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("segment", [1, 2, 4])
def test_recomputed_training_gives_identical_losses_and_gradients(segment):
    plain = GPT(dataclasses.replace(CONFIG, positions="rope"))
    checkpointed = GPT(dataclasses.replace(CONFIG, positions="rope"))
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.recompute_segment = segment
    idx = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(0))
    loss_a, grads_a = _loss_and_grads(plain, idx)
    loss_b, grads_b = _loss_and_grads(checkpointed, idx)
    assert loss_a == loss_b
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_recompute_agrees_with_torch_utils_checkpoint_and_runs_the_segment_twice():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 5))
    calls = []
    layer.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(4, 5, requires_grad=True)
    ours = recompute(layer, x, list(layer.parameters())).pow(2).sum()
    grads_ours = torch.autograd.grad(ours, [x, *layer.parameters()])
    assert len(calls) == 2  # forward, then the recomputation inside backward
    theirs = checkpoint(layer, x, use_reentrant=False).pow(2).sum()
    grads_theirs = torch.autograd.grad(theirs, [x, *layer.parameters()])
    assert ours.item() == theirs.item()
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _peak(model, idx):
    with ActivationMeter(exclude=list(model.parameters())) as meter:
        _, loss = model(idx, idx)
        loss.backward()
    return meter.peak


def test_a_chain_of_n_layers_checkpointed_every_k_keeps_n_over_k_plus_k_activations():
    n, size = 64, 1000

    def layers(h, count):
        for _ in range(count):
            h = torch.tanh(h)  # saves its output: one activation per layer
        return h

    def peak(k):
        x = torch.randn(size, requires_grad=True)
        with ActivationMeter() as meter:
            h = x
            for _ in range(n // k):
                h = recompute(lambda t: layers(t, k), h, [])
            h.sum().backward()
        return meter.peak // (4 * size)

    assert {k: peak(k) for k in (1, 2, 4, 8, 16, 64)} == {k: n // k + k for k in (1, 2, 4, 8, 16, 64)}


def test_checkpointing_the_gpt_cuts_activation_memory_and_trades_boundaries_for_segments():
    model = GPT(dataclasses.replace(CONFIG, n_layer=16))
    idx = torch.zeros(2, 16, dtype=torch.long)
    peaks = {}
    for k in (0, 1, 2, 4, 16):
        model.recompute_segment = k
        peaks[k] = _peak(model, idx)
    assert peaks[1] < peaks[2] < peaks[4] < peaks[16] and peaks[1] < peaks[0] / 5
    # every block saves far more than its input, so the optimum n/k*input + k*block sits at k = 1 here
    assert peaks[16] == pytest.approx(peaks[0], rel=0.05)  # one segment of everything saves nothing


def test_meter_counts_a_shared_saved_tensor_once_and_forgets_it_after_backward():
    x = torch.randn(1000, requires_grad=True)
    with ActivationMeter() as meter:
        y = x.sin()  # saves x (4000 bytes)
        z = (y * y).sum()  # saves y twice: one storage
        assert meter.live == 8000
        z.backward()
    assert meter.peak == 8000 and meter.live == 0
