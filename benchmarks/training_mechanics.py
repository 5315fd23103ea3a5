"""Module 8 on the CPU: what checkpointing, 16-bit training and two processes cost and save.

- Gradient checkpointing on a 12-block GPT: time per training step (best of several) and the peak
  activation memory (``ActivationMeter``) for segment lengths 1, 2, 3, 4, 6, 12 against no
  checkpointing, after checking the loss is the same.
- Precision: time per training step of fp32, fp16 with master weights and loss scaling, and
  bf16 autocast, with each one's loss drift from fp32 after the same steps.
- Data parallelism: wall time of the same steps in 1 process and in 2 (DDP, FSDP2), startup
  included — on two cores, the honest picture of what process parallelism costs at this size.
- AdamW under FSDP2: one step of the book's AdamW over a 12-block GPT's 148 sharded parameters,
  each operation on the DTensors themselves and on their local shards (what ``optim.AdamW``
  does), in one gloo process, after checking both give the same weights.

    python benchmarks/training_mechanics.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, alone, write_result  # noqa: E402

from posttrainllm import optim  # noqa: E402
from posttrainllm.checkpointing import ActivationMeter  # noqa: E402
from posttrainllm.data import get_batch  # noqa: E402
from posttrainllm.distributed import train_parallel, train_single  # noqa: E402
from posttrainllm.measure import measure_seconds  # noqa: E402
from posttrainllm.mixed_precision import Fp16Trainer  # noqa: E402
from posttrainllm.model import GPT, GPTConfig  # noqa: E402
from posttrainllm.optim import AdamW  # noqa: E402


def checkpointing(args, ids) -> None:
    config = GPTConfig(vocab_size=512, block_size=64, n_layer=4 if args.quick else 12, n_head=4, n_embd=64)
    model = GPT(config)
    x, y = get_batch(ids, 16, config.block_size, generator=torch.Generator().manual_seed(0))

    def step():
        model.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        return loss.item()

    rows, baseline = [], None
    for k in [0, 1, 2, 4] if args.quick else [0, 1, 2, 3, 4, 6, 12]:
        model.recompute_segment = k
        with ActivationMeter(exclude=list(model.parameters())) as meter:
            loss = step()
        seconds = measure_seconds(step, args.repeats)
        baseline = baseline or (seconds, meter.peak, loss)
        assert loss == baseline[2], "checkpointing changed the loss"
        rows.append(["off" if k == 0 else k, f"{seconds * 1e3:.1f}", f"{seconds / baseline[0]:.2f}x",
                     f"{meter.peak / 2**20:.2f}", f"{meter.peak / baseline[1]:.1%}"])
    write_result(
        "checkpointing",
        f"Gradient checkpointing, {config.n_layer}-block GPT, batch 16 x 64: one forward + backward",
        ["blocks per segment", "ms / step", "time vs off", "peak activations MiB", "memory vs off"],
        rows,
        "Checkpointing recomputes each segment's forward inside backward, so the expected cost is about one extra "
        "forward (forward is roughly a third of a training step). Memory counts tensors saved for backward.",
        args.out,
    )


def precision(args, ids) -> None:
    config = GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64)
    steps = 5 if args.quick else 40
    generator = torch.Generator().manual_seed(0)
    batches = [get_batch(ids, 16, config.block_size, generator=generator) for _ in range(steps)]

    def plain(autocast: bool):
        model = GPT(config)
        opt = AdamW(model.parameters(), lr=3e-3, weight_decay=0)
        losses = []
        for x, y in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def fp16():
        model = GPT(config)
        trainer = Fp16Trainer(model, AdamW(model.parameters(), lr=3e-3, weight_decay=0))
        return [trainer.step(x, y) for x, y in batches]

    contenders = {"fp32": lambda: plain(False), "fp16 + master weights + loss scaling": fp16,
                  "bf16 autocast": lambda: plain(True)}
    losses = {name: run() for name, run in contenders.items()}
    times = {name: measure_seconds(run, 1 if args.quick else 2) / steps for name, run in contenders.items()}
    rows = [[name, f"{times[name] * 1e3:.1f}", f"{times[name] / times['fp32']:.2f}x", f"{losses[name][-1]:.4f}",
             f"{np.abs(np.array(losses[name]) - losses['fp32']).max():.4f}"] for name in contenders]
    write_result(
        "precision",
        f"Training the 2-block GPT in 16 bits on the CPU ({steps} steps, batch 16 x 64)",
        ["precision", "ms / step", "time vs fp32", "final loss", "largest loss drift from fp32"],
        rows,
        "CPUs without fast 16-bit units gain no speed; the table shows the drift, and on a GPU the same code runs on "
        "its fp16/bf16 units.",
        args.out,
    )


def data_parallel(args, ids) -> None:
    config = GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64)
    steps = 3 if args.quick else 30
    start = time.perf_counter()
    reference, _ = train_single(config, ids, steps, batch_size=16, lr=3e-3)
    rows = [["1 process", f"{time.perf_counter() - start:.1f}", "0"]]
    for mode in ("ddp", "fsdp"):
        start = time.perf_counter()
        result = train_parallel(config, ids, steps, batch_size=16, lr=3e-3, world_size=2, mode=mode)
        seconds = time.perf_counter() - start
        drift = max((result["state_dict"][k] - v).abs().max().item() for k, v in reference.items())
        rows.append([f"2 processes, {mode}", f"{seconds:.1f}", f"{drift:.1e}"])
    write_result(
        "data_parallel",
        f"{steps} training steps of the 2-block GPT (global batch 16 x 64), gloo on 127.0.0.1",
        ["run", "seconds (with startup)", "largest weight difference"],
        rows,
        "Two processes on a two-core machine: startup (a Python and torch import per process) dominates at this size; "
        "the point of the table is that the weights agree.",
        args.out,
    )


def fsdp_optimizer(args) -> None:
    (times, n_params), same = alone(_adamw_on_shards, 5 * args.repeats)  # a step is milliseconds: many repeats
    assert same, "AdamW on the local shards moved the weights differently from AdamW on the DTensors"
    plain = times["on each DTensor's local shard"]
    # whole milliseconds and ratios: repeated runs here moved both by about 10%
    rows = [[name, f"{1e3 * seconds:.0f}", f"{seconds / plain:.0f}x"] for name, seconds in times.items()]
    write_result(
        "fsdp_optimizer",
        f"One AdamW step over a 12-block GPT's {n_params} parameters, sharded by FSDP2 (one gloo process)",
        ["each operation", "ms per step (best of repeats)", "vs local shards"],
        rows,
        "One process, one thread; both give the same weights, bit for bit, after a step. Width 64, so the arithmetic "
        "is small and what differs is the cost of dispatching each operation through DTensor, which on a GPU "
        "is CPU time spent before each kernel can start.",
        args.out,
    )


def _adamw_on_shards(repeats: int) -> tuple[tuple[dict[str, float], int], bool]:
    import tempfile

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    times, weights, shards = {}, {}, optim._local
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        try:
            mesh = init_device_mesh("cpu", (1,))
            for name, local in (("on the DTensors", lambda t: t), ("on each DTensor's local shard", shards)):
                torch.manual_seed(0)
                model = GPT(GPTConfig(vocab_size=512, block_size=64, n_layer=12, n_head=4, n_embd=64))
                for block in model.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
                x = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(0))
                model(x, x)[1].backward()
                optimizer = AdamW(model.parameters(), lr=1e-3)
                optim._local = local  # the DTensor contender: every operation dispatched on the DTensor
                try:
                    optimizer.step()  # the moments' first allocation is not timed
                    weights[name] = [p.full_tensor().clone() for p in model.parameters()]
                    times[name] = measure_seconds(optimizer.step, repeats)
                finally:
                    optim._local = shards
        finally:
            dist.destroy_process_group()
    first, second = weights.values()
    return (times, len(first)), all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.repeats = 1 if args.quick else 5
    torch.manual_seed(0)
    ids = np.random.default_rng(0).integers(0, 512, 50_000)
    checkpointing(args, ids)
    precision(args, ids)
    data_parallel(args, ids)
    fsdp_optimizer(args)


if __name__ == "__main__":
    main()
