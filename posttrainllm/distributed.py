"""Module 8: data-parallel training of the oracle GPT on ``torch.distributed`` (gloo, CPU).

:func:`train_parallel` starts ``world_size`` processes on this machine (``torch.multiprocessing``,
rendezvous on 127.0.0.1). Each builds the same model from the same seed, takes its slice of every
global batch, and trains:

- ``mode="ddp"``: ``DistributedDataParallel`` — every process holds all the weights and all the
  optimizer state; after backward the gradients are averaged across processes (all-reduce), so
  every process takes the same step. Memory per process: the whole model, ``world_size`` times.
- ``mode="fsdp"``: FSDP2's ``fully_shard`` on each block and on the model — each process keeps
  only its shard of every weight, gradient and optimizer state (the ZeRO-3 layout), gathers a
  block's full weights just before using it, and reduce-scatters the gradients after.

Averaging the gradients of equal slices equals the gradient of the mean loss on the whole batch,
so both must end where one process training on the concatenated batch ends
(:func:`train_single`) — up to float rounding in the order of the sums.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posttrainllm.data import get_batch
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.optim import AdamW


def _batches(ids: np.ndarray, steps: int, batch_size: int, block_size: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [get_batch(ids, batch_size, block_size, generator=generator) for _ in range(steps)]


def train_single(config: GPTConfig, ids: np.ndarray, steps: int, batch_size: int, lr: float, seed: int = 0):
    """The reference: one process, the whole global batch. Returns ``(state_dict, losses)``."""
    model = GPT(config)
    optimizer = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for x, y in _batches(ids, steps, batch_size, config.block_size, seed):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model.state_dict(), losses


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no process is listening on now: where a local process group
    (torchrun's rendezvous, or ``mp.spawn``'s workers) can meet."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, modes: tuple[str, ...], config: dict, ids, steps, batch_size, lr, seed,
            out, dtype: torch.dtype) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_default_dtype(dtype)  # a spawned process starts at float32, whatever its parent set
    torch.set_num_threads(1)  # one core per process: the processes are the parallelism
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for mode in modes:  # one process group serves every mode: starting processes is the slow part
            _train_one(rank, world, mode, config, ids, steps, batch_size, lr, seed, Path(out) / mode)
    finally:
        dist.destroy_process_group()


def _train_one(rank: int, world: int, mode: str, config: dict, ids, steps, batch_size, lr, seed, out: Path) -> None:
    model = GPT(GPTConfig(**config))
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))  # FSDP2's default mesh would be CUDA's wherever CUDA exists
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    optimizer = AdamW(wrapped.parameters(), lr=lr, weight_decay=0.0)
    share = batch_size // world
    losses = []
    for x, y in _batches(ids, steps, batch_size, config["block_size"], seed):
        rows = slice(rank * share, (rank + 1) * share)  # this process's slice of the global batch
        _, loss = wrapped(x[rows], y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    # FSDP2 weights are DTensors holding one shard each: gather the full tensors to compare
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach()
             for k, v in model.state_dict().items()}
    out.mkdir(exist_ok=True)
    if rank == 0:
        torch.save({"state_dict": state, "losses": losses, "local_params": local}, out / "rank0.pt")
    torch.save({"local_params": local}, out / f"params-{rank}.pt")


def train_parallel(
    config: GPTConfig, ids: np.ndarray, steps: int, batch_size: int, lr: float, world_size: int = 2,
    mode: str = "ddp", seed: int = 0,
) -> dict:
    """Train in ``world_size`` processes, in the caller's default dtype. Returns ``{"state_dict",
    "losses", "params_per_process"}`` (the last: how many parameter values each process stores)."""
    return train_parallel_modes(config, ids, steps, batch_size, lr, world_size, (mode,), seed)[mode]


def train_parallel_modes(
    config: GPTConfig, ids: np.ndarray, steps: int, batch_size: int, lr: float, world_size: int = 2,
    modes: tuple[str, ...] = ("ddp", "fsdp"), seed: int = 0,
) -> dict[str, dict]:
    """:func:`train_parallel` for each of ``modes``, one after the other in the same processes."""
    unknown = [m for m in modes if m not in ("ddp", "fsdp")]
    if unknown or not modes:
        raise ValueError(f"mode must be 'ddp' or 'fsdp', got {', '.join(map(repr, unknown)) or 'none'}")
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} does not split evenly over world_size={world_size} processes")
    results = {}
    with tempfile.TemporaryDirectory() as out:
        args = (world_size, free_port(), tuple(modes), asdict(config), ids, steps, batch_size, lr, seed, out,
                torch.get_default_dtype())
        mp.spawn(_worker, args=args, nprocs=world_size, join=True)
        for mode in modes:
            result = torch.load(Path(out) / mode / "rank0.pt", weights_only=True)
            per_process = [torch.load(Path(out) / mode / f"params-{r}.pt", weights_only=True)["local_params"]
                           for r in range(world_size)]
            results[mode] = {"state_dict": result["state_dict"], "losses": result["losses"],
                             "params_per_process": per_process}
    return results
