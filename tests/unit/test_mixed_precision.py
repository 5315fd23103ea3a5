import torch

from posttrainllm.mixed_precision import Fp16Trainer, LossScaler
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.optim import AdamW


def _tiny_gradient(scale: float) -> float:
    """d/dw of (w * 2^-13) * 2^-13 = 2^-26, below fp16's smallest subnormal (2^-24), in fp16."""
    w = torch.tensor(1.0, dtype=torch.float16, requires_grad=True)
    loss = (w * 2.0**-13) * 2.0**-13
    (loss * scale).backward()
    grad = w.grad.float()
    LossScaler(scale=scale).unscale_([grad])
    return grad.item()


def test_gradients_that_underflow_in_fp16_survive_with_loss_scaling():
    assert _tiny_gradient(scale=1.0) == 0.0
    assert _tiny_gradient(scale=2.0**10) == 2.0**-26  # (2^16 would itself overflow this fp16 scalar loss)


def test_scale_backs_off_on_overflow_and_grows_after_a_run_of_good_steps():
    scaler = LossScaler(scale=1024.0, growth_interval=3)
    assert scaler.unscale_([torch.tensor([1.0, float("inf")])])
    scaler.update(True)
    assert scaler.scale == 512.0
    for _ in range(3):
        assert not scaler.unscale_([torch.tensor([1.0])])
        scaler.update(False)
    assert scaler.scale == 1024.0


CONFIG = GPTConfig(vocab_size=30, block_size=8, n_layer=1, n_head=2, n_embd=16)


def test_an_overflowing_step_is_skipped_and_leaves_the_master_weights_alone():
    model = GPT(CONFIG)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Fp16Trainer(model, AdamW(model.parameters(), lr=1e-2), LossScaler(scale=2.0**40))
    idx = torch.randint(0, 30, (4, 8), generator=torch.Generator().manual_seed(0))
    trainer.step(idx, idx)
    assert trainer.skipped == 1 and trainer.scaler.scale == 2.0**39
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_training_follows_fp32_training_closely():
    fp32, master = GPT(CONFIG), GPT(CONFIG)
    opt32 = AdamW(fp32.parameters(), lr=3e-3)
    trainer = Fp16Trainer(master, AdamW(master.parameters(), lr=3e-3))
    generator = torch.Generator().manual_seed(1)
    for _ in range(30):
        idx = torch.randint(0, 30, (8, 8), generator=generator)
        _, loss32 = fp32(idx, idx)
        opt32.zero_grad()
        loss32.backward()
        opt32.step()
        loss16 = trainer.step(idx, idx)
    assert trainer.skipped == 0
    assert abs(loss16 - loss32.item()) < 0.02 * loss32.item()
