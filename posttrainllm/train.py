"""Module 7: training, evaluating, checkpointing and sampling the oracle GPT.

Used by this module's notebook and by every later one. Training is deterministic for a given
seed on a given machine: the batches come from a seeded generator, the weights from the
config's seed. Every function takes a ``device`` (see :func:`device.place`: by default
``POSTTRAINLLM_DEVICE``, else where the model already is); the model is borrowed there for the call
(:func:`device.borrowed`), and its batches and KV caches are made there. Checkpoints are loaded
with ``torch.load(weights_only=True)``, so opening a checkpoint can never run code from the file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch

from posttrainllm import atomic
from posttrainllm import progress as bars
from posttrainllm.data import get_batch
from posttrainllm.device import borrowed
from posttrainllm.model import GPT, GPTConfig, KVCache
from posttrainllm.optim import clip_grad_norm, set_lr
from posttrainllm.sampling import sample

CHECKPOINT_FORMAT = "posttrainllm-gpt-checkpoint v1"


@torch.no_grad()
def evaluate(model: GPT, ids, batch_size: int = 32, batches: int = 8, seed: int = 1234,
             device: str | None = None) -> float:
    """Mean loss over ``batches`` seeded random batches of ``ids`` (the same batches every call, on
    any device: they are drawn on the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    with borrowed(model, device) as device:
        model.eval()
        losses = [
            model(*get_batch(ids, batch_size, model.config.block_size, device, generator=generator))[1].item()
            for _ in range(batches)
        ]
        model.train()
    return float(np.mean(losses))


def train(
    model: GPT,
    train_ids,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    val_ids=None,
    eval_every: int = 0,
    seed: int = 0,
    progress: bool = False,
    callback: Callable[[int, dict], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    lr_schedule: Callable[[int], float] | None = None,
    max_grad_norm: float | None = None,
    device: str | None = None,
) -> dict:
    """Train on random windows of ``train_ids``. Returns ``{"train": [...], "val": [(step, loss)],
    "lr": [...], "grad_norm": [...]}`` (``grad_norm`` only when clipping).

    The optimizer defaults to ``torch.optim.AdamW(lr=lr, weight_decay=0)``; module 8 passes its
    own. ``lr_schedule(step)`` sets the learning rate before each step; ``max_grad_norm`` clips
    the global gradient norm. ``callback(step, history)`` runs after every step (a live plot, an
    early stop, a log line). The model and the optimizer's state go to ``device`` for the run and
    come back where they were afterwards (:func:`device.borrowed`).
    """
    generator = torch.Generator().manual_seed(seed)
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    history: dict = {"train": [], "val": [], "lr": [], "grad_norm": []}
    steps_iter = bars.steps(steps, "next-token loss", show=progress)
    with borrowed(model, device, optimizer) as device:
        for step in steps_iter:
            if lr_schedule is not None:
                set_lr(optimizer, lr_schedule(step))
            batch = get_batch(train_ids, batch_size, model.config.block_size, device, generator=generator)
            loss, norm = accumulated_step(model, [batch], optimizer, max_grad_norm)
            if norm is not None:
                history["grad_norm"].append(norm)
            history["train"].append(loss)
            history["lr"].append(optimizer.param_groups[0]["lr"])
            if val_ids is not None and eval_every and (step + 1) % eval_every == 0:
                history["val"].append((step + 1, evaluate(model, val_ids, device=device)))
            if callback is not None:
                callback(step, history)
    return history


def accumulated_step(model: GPT, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                     optimizer: torch.optim.Optimizer, max_norm: float | None = None) -> tuple[float, float | None]:
    """One optimizer step on the gradient of several micro-batches ``(x, y)`` taken together.

    Each micro-batch's loss is divided by their number before its backward pass, so the gradients
    that ``backward`` adds up are those of the mean loss over all their rows (for micro-batches of
    one size): a batch too large for memory, in pieces. Then the gradients' global norm is clipped
    to ``max_norm`` (when given), and the optimizer steps. Returns the mean loss and the norm
    before clipping (``None`` without clipping)."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / len(micro_batches)).backward()
        total += loss.item()
    norm = clip_grad_norm(model.parameters(), max_norm) if max_norm is not None else None
    optimizer.step()
    return total / len(micro_batches), norm


@torch.no_grad()
def generate(
    model: GPT, prompt: list[int], length: int, rng: np.random.Generator, temperature: float = 1.0,
    top_k: int | None = None, top_p: float | None = None, device: str | None = None,
) -> list[int]:
    """Extend ``prompt`` by ``length`` tokens with module 5's samplers (greedy at temperature 0).
    The model runs on ``device``; each step's logits come back to the CPU for the numpy sampler."""
    ids = list(prompt)
    with borrowed(model, device) as device:
        model.eval()
        for _ in range(length):
            context = torch.tensor([ids[-model.config.block_size :]], device=device)
            logits = model(context)[0, -1].double().cpu().numpy()
            ids.append(sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng))
        model.train()
    return ids


@torch.no_grad()
def greedy(model: GPT, context: list[int], max_tokens: int, stop: int | None = None,
           device: str | None = None) -> list[int]:
    """Up to ``max_tokens`` argmax tokens after ``context``, decoded with a KV cache on ``device``;
    ends early at ``stop`` (not included). ``context + max_tokens`` must fit in ``block_size``."""
    out: list[int] = []
    with borrowed(model, device) as device:
        model.eval()
        cache = KVCache(model.config.n_layer)
        logits = model(torch.tensor([context], device=device), cache=cache)[0, -1]
        while len(out) < max_tokens:
            token = int(logits.argmax())
            if token == stop:
                break
            out.append(token)
            if len(out) < max_tokens:
                logits = model(torch.tensor([[token]], device=device), cache=cache)[0, -1]
    return out


def _digest(value, hasher=None) -> str:
    """SHA-256 of a payload's contents: keys, tensors' dtypes, shapes and bytes, other values' reprs.
    ``torch.load`` reads a flipped byte inside tensor data without complaint; this catches it."""
    hasher = hasher or hashlib.sha256()
    if isinstance(value, dict):
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode())
            _digest(value[key], hasher)
    elif isinstance(value, list | tuple):
        hasher.update(f"{type(value).__name__}[{len(value)}]".encode())
        for item in value:
            _digest(item, hasher)
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        hasher.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        hasher.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        hasher.update(repr(value).encode())
    return hasher.hexdigest()


def save_file(payload: dict, path: str | Path) -> None:
    """``torch.save`` written atomically (a crash leaves the old file or the new, never half), with a
    SHA-256 of the contents that :func:`load_file` checks."""
    with atomic.replacing(path) as tmp:
        torch.save({**payload, "sha256": _digest(payload)}, tmp)


def load_file(path: str | Path, marker: str, what: str, kind: str) -> dict:
    """Read a file :func:`save_file` wrote, with ``weights_only=True`` so it can never run code.
    A truncated or corrupt file ("not a readable ``kind``") or one without ``marker`` ("not a
    posttrainllm ``what``") raises ``ValueError`` saying which."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - torch raises many types for a damaged file
        raise ValueError(
            f"{path} is not a readable {kind} (truncated or corrupt?): {type(err).__name__}: {err}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != marker:
        raise ValueError(f"{path} is not a posttrainllm {what} (no {marker!r} marker)")
    stored = payload.pop("sha256", None)
    if stored != _digest(payload):
        why = "has no checksum (written by an older version)" if stored is None else "fails its checksum (damaged)"
        raise ValueError(f"{path} {why}: delete it and save or build it again")
    return payload


def save_checkpoint(model: GPT, path: str | Path, optimizer: torch.optim.Optimizer | None = None,
                    step: int | None = None) -> None:
    """Config and weights, and, to resume training, the optimizer's state and the number of steps
    taken; written atomically. :func:`load_file` maps every tensor to the CPU, so any device can load them."""
    payload = {"format": CHECKPOINT_FORMAT, "config": asdict(model.config), "state_dict": model.state_dict()}
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if step is not None:
        payload["step"] = int(step)
    save_file(payload, path)


def resume(path: str | Path, model: GPT, optimizer: torch.optim.Optimizer) -> int:
    """Load a checkpoint saved with an optimizer into ``model`` and ``optimizer`` (built over that
    model's parameters, on the device the model is on); return the step to continue from."""
    payload = load_file(path, CHECKPOINT_FORMAT, "GPT checkpoint", "checkpoint")
    if "optimizer" not in payload or "step" not in payload:
        raise ValueError(f"{path} holds weights only (saved without optimizer= and step=): it cannot resume a run")
    shape = {k: v for k, v in asdict(model.config).items() if k != "seed"}  # the seed only drew the first weights
    if {k: v for k, v in payload["config"].items() if k != "seed"} != shape:
        raise ValueError(f"{path} was saved from a model with another config: {payload['config']}")
    model.load_state_dict(payload["state_dict"])
    optimizer.load_state_dict(payload["optimizer"])
    return payload["step"]


def load_checkpoint(path: str | Path) -> GPT:
    """Rebuild the model, in the dtype it was saved in. A truncated, corrupt or foreign file raises
    ``ValueError`` saying so."""
    payload = load_file(path, CHECKPOINT_FORMAT, "GPT checkpoint", "checkpoint")
    state, config = payload.get("state_dict"), payload.get("config")
    if not isinstance(state, dict) or not isinstance(config, dict):
        raise ValueError(f"{path} has no model config or no state dict")
    unknown = sorted(set(config) - {f.name for f in fields(GPTConfig)})
    if unknown:
        raise ValueError(f"{path}: unknown config keys {unknown} (saved by another version?)")
    # in the dtype it was saved in (the book's models are float64), not the caller's default
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.get_default_dtype())
    model = GPT(GPTConfig(**config)).to(dtype)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # missing or extra weights, or the wrong shapes for its config
        raise ValueError(f"{path}: the weights do not fit the model its config describes: {err}") from None
    return model
