"""ZeRO's memory arithmetic, and the bytes each process really holds under DDP, ZeRO-1 and FSDP2
(the training-at-scale chapter, ``book/training-at-scale.md``).

Rajbhandari et al. (*ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*,
2019) count what data-parallel training keeps per device for a model of ``P`` parameters: the
parameters, their gradients, and the optimizer's state. Plain data parallelism (DDP) keeps all
three on every one of the ``N`` devices. ZeRO partitions them in stages: stage 1 splits the
optimizer state ``N`` ways, stage 2 the gradients too, stage 3 the parameters too (PyTorch's FSDP
is stage 3). :func:`bytes_per_device` is that count.

:func:`measure` checks it on real processes: it starts ``world_size`` CPU processes (gloo), trains
one step of the oracle GPT under ``DistributedDataParallel``, under ``ZeroRedundancyOptimizer``
(ZeRO-1) and under FSDP2's ``fully_shard`` (ZeRO-3), and sums the bytes of the parameter, gradient
and optimizer-state tensors each process holds afterwards. Stage 2 is computed only: FSDP2's
``reshard_after_forward=False`` (FSDP1's ``SHARD_GRAD_OP``) is PyTorch's nearest to it, but it
differs from stage 3 only inside a step, so what a process holds after a step cannot tell them apart.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posttrainllm.distributed import free_port
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.optim import AdamW

STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}


def bytes_per_device(n_params: float, world_size: int, stage: int, param_bytes: int = 2, grad_bytes: int = 2,
                     optimizer_bytes: int = 12) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state per device at a ZeRO ``stage`` (0 is DDP).
    The defaults are the paper's mixed-precision Adam: fp16 parameters and gradients, and 12 bytes
    of fp32 state per parameter (a master copy, the momentum, the variance)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {sorted(STAGES)} (0 is plain data parallelism), got {stage}")
    split = {name: world_size if stage >= s else 1 for name, s in (("optimizer", 1), ("grads", 2), ("params", 3))}
    parts = {"params": n_params * param_bytes / split["params"], "grads": n_params * grad_bytes / split["grads"],
             "optimizer": n_params * optimizer_bytes / split["optimizer"]}
    return {**parts, "total": sum(parts.values())}


def _local_bytes(tensor: torch.Tensor | None) -> int:
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # an FSDP2 DTensor holds one shard
    return local.numel() * local.element_size()


def _state_bytes(state: dict) -> int:
    return sum(_local_bytes(v) for s in state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)


def _wrap(mode: str, model: GPT):
    """The model to call and the optimizer to step, for one way of sharding."""
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, AdamW(model.parameters(), lr=1e-3)
    from torch.nn.parallel import DistributedDataParallel

    wrapped = DistributedDataParallel(model, gradient_as_bucket_view=True)  # no second copy of the gradients
    if mode == "ddp":
        return wrapped, AdamW(model.parameters(), lr=1e-3)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return wrapped, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=AdamW, lr=1e-3)


def _worker(rank: int, world: int, port: int, config: dict, modes: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        report = {}
        for mode in modes:
            model = GPT(GPTConfig(**config))
            wrapped, optimizer = _wrap(mode, model)
            generator = torch.Generator().manual_seed(rank)
            idx = torch.randint(config["vocab_size"], (2, config["block_size"]), generator=generator)
            _, loss = wrapped(idx, idx)
            loss.backward()
            optimizer.step()
            state = optimizer.optim.state if mode == "zero1" else optimizer.state  # ZeRO-1: this rank's shard only
            report[mode] = {"params": sum(_local_bytes(p) for p in model.parameters()),
                            "grads": sum(_local_bytes(p.grad) for p in model.parameters()),
                            "optimizer": _state_bytes(state)}
            dist.barrier()
        torch.save(report, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def measure(config: GPTConfig, world_size: int, modes: tuple[str, ...] = ("ddp", "zero1", "fsdp")) -> list[dict]:
    """For each rank, ``{mode: {"params", "grads", "optimizer"}}``: bytes held after one training step."""
    unknown = set(modes) - {"ddp", "zero1", "fsdp"}
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}: choose from ddp, zero1, fsdp")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(world_size, free_port(), asdict(config), list(modes), out), nprocs=world_size,
                 join=True)
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
