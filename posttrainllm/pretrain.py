"""Module 8: the book's GPT pretrained by ``torchrun``, on one process or many, CPU or GPU.

    python -m posttrainllm.pretrain --processes 2 --config tiny steps=200 out=runs/tiny
    torchrun --nproc_per_node=2 -m posttrainllm.pretrain --config tiny steps=200 out=runs/tiny
    python -m posttrainllm.pretrain --config gpt2-small data=tokens.npy      # one process

``--processes N`` checks the settings, the data and the run's folder (:func:`check`) before it
starts torchrun, so a mistake there is one line of error and no process is started. Under a bare
``torchrun`` every process makes the same checks, rank 0 names the problem in one line, and
torchrun then reports the failed processes in its own words. A second run into a folder that a
run is using is refused: rank 0 holds a lock on it.

``torchrun`` starts one process per device and gives each ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE``; each joins one process group (NCCL on CUDA, gloo on the CPU) and wraps the model:

- ``parallel = "ddp"``: every process holds the whole model; gradients are averaged (all-reduce).
- ``parallel = "fsdp"``: FSDP2's ``fully_shard`` on each block and on the model, over a 1-D device
  mesh: each process keeps a shard of every weight, gradient and Adam moment (the ZeRO-3 layout).

The data is a 1-D array of token ids cut into windows of ``block_size + 1`` (:class:`Windows`).
Global sample ``i`` is a fixed window whatever the world size, and step ``s`` trains on samples
``s*G ... s*G + G - 1`` (``G`` = micro_batch x grad_accum x world size), each rank reading only
its own contiguous slice of them from a memory-mapped file. So two processes see exactly the
rows one process with twice the accumulation sees, and a run resumed on another world size with
the same ``G`` continues the same stream.

A step is ``grad_accum`` forwards per process (gradient sync only on the last: ``no_sync`` for
DDP, ``set_requires_gradient_sync`` for FSDP2, which also keeps its gathered weights from one
micro-batch to the next), then the book's global-norm clipping, warmup +
cosine schedule and AdamW (module 8). ``precision = "bf16"`` trains bf16 activations on fp32
weights: autocast, and for FSDP2 a ``MixedPrecisionPolicy`` that gathers the weights in bf16 and
reduces the gradients in fp32.

Checkpoints (``save_every``) are written with ``torch.distributed.checkpoint`` (DCP): each
process writes its own shards, and a load re-shards for another world size. Beside them a
``state.pt`` (written last, so a crash mid-save leaves no usable-looking checkpoint) holds the
step, the samples consumed, the config, each process's RNG states, and the SHA-256 of every DCP
file. Loading checks those hashes before DCP reads a byte, and reads DCP's pickled index with an
unpickler that admits only DCP's own metadata classes: a truncated or foreign checkpoint is
refused with a message, and no file can make the loader run code.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import pickle
import re
import shutil
import sys
import time
import tomllib
import typing
import warnings
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from posttrainllm import atomic
from posttrainllm.device import ENV, resolve_device
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.optim import AdamW, clip_grad_norm, set_lr, warmup_cosine
from posttrainllm.train import load_file, save_file

STATE_FORMAT = "posttrainllm-pretrain-state v1"
PRECISIONS = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.float32}  # bf16: fp32 master weights


@dataclass(frozen=True)
class PretrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: str = "builtin"  # a .npy of token ids, or "builtin": module 7's oracle corpus and tokenizer
    micro_batch: int = 8  # rows per forward, per process
    grad_accum: int = 1  # forwards per step, per process
    steps: int = 100
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 10
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0  # 0: no clipping
    parallel: str = "ddp"  # or "fsdp"; ignored by a single process started without torchrun
    reshard_after_forward: bool = True  # FSDP2: free a block's gathered weights after its forward
    # (ZeRO-3), gathering them again for its backward; false keeps them until then (more memory)
    precision: str = "fp32"  # "bf16" or "fp64"
    compile: bool = False
    device: str = ""  # "" = POSTTRAINLLM_DEVICE, else "auto" (CUDA, then MPS, then the CPU)
    out: str = "runs/pretrain"
    save_every: int = 0  # 0: save only at the end
    keep: int = 0  # keep only the newest this many checkpoints; 0: keep them all
    val_data: str = ""  # held-out ids for a validation loss: "builtin" (the oracle's last 10%) or a .npy
    eval_every: int = 0  # > 0: the validation loss every this many steps, in the log (needs val_data)
    nonfinite: str = "stop"  # a step whose loss or gradient norm is NaN or infinite: "stop" or "skip" it
    stop_after: int = 0  # > 0: stop after this step as a crash would (no final save); the resume test's cut
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        _check_fields(PretrainConfig, vars(self))
        _check_fields(GPTConfig, vars(self.model), "model.")
        if self.parallel not in ("ddp", "fsdp"):
            raise ValueError(f"parallel must be 'ddp' or 'fsdp', got {self.parallel!r}")
        if self.nonfinite not in ("stop", "skip"):
            raise ValueError(f"nonfinite must be 'stop' or 'skip', got {self.nonfinite!r}")
        if self.eval_every and not self.val_data:
            raise ValueError("eval_every needs val_data: 'builtin' (with data=builtin) or a .npy of held-out ids")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}")
        for key in ("lr", "min_lr", "weight_decay", "max_grad_norm"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0) or (key == "lr" and value == 0):
                raise ValueError(f"{key} must be a finite number{' above' if key == 'lr' else ', at least'} 0, "
                                 f"got {value}" + (" (0 turns clipping off)" if key == "max_grad_norm" else ""))
        if self.lr > MAX_LR:
            raise ValueError(f"lr={self.lr} is above {MAX_LR}: AdamW moves each weight by about lr a step, so no "
                             "model trains there (and past about 1e37 the step overflows float32)")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr={self.min_lr} is above lr={self.lr}: the schedule decays from lr down to min_lr")
        if not self.out:
            raise ValueError("out must name the run's folder")


MAX_LR = 10.0  # module 8's range test blows up past 1e-1; ten is a hundred times that

# the least value of each whole-number setting
FLOORS = {"micro_batch": 1, "grad_accum": 1, "steps": 1, "warmup": 0, "save_every": 0, "stop_after": 0, "seed": 0,
          "keep": 0, "eval_every": 0,
          "model.vocab_size": 1, "model.block_size": 1, "model.n_layer": 1, "model.n_head": 1, "model.n_embd": 1,
          "model.n_kv_head": 1, "model.window": 1, "model.seed": 0}


def _check_fields(cls: type, values: dict, prefix: str = "") -> None:
    """Each given field holds its declared type and is at least its floor: TOML's ``"false"`` (a
    string) or ``1.5`` for a step count would otherwise switch a setting on or fail deep in the run."""
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
    for name, hint in typing.get_type_hints(cls).items():
        if name not in values or hint is GPTConfig:
            continue
        value, kinds = values[name], typing.get_args(hint) or (hint,)
        if not any(_is(value, kind) for kind in kinds):
            wanted = " or ".join(names.get(k, "nothing" if k is type(None) else k.__name__) for k in kinds)
            raise ValueError(f"{prefix}{name} must be {wanted}, got {value!r}")
        floor = FLOORS.get(prefix + name)
        if floor is not None and value is not None and value < floor:
            raise ValueError(f"{prefix}{name} must be at least {floor}, got {value}")


def _is(value, kind: type) -> bool:
    if isinstance(value, bool) or kind is bool:  # bool is an int to Python, not to a config
        return type(value) is kind
    if kind is float:
        return isinstance(value, int | float)  # 1 is a fine learning-rate floor
    return value is None if kind is type(None) else isinstance(value, kind)


def load_config(name: str, overrides: list[str] = ()) -> PretrainConfig:
    """A shipped config by name (``tiny``, ``gpt2-small``) or a TOML file, with ``key=value``
    overrides (``steps=20``, ``model.n_layer=4``; values are TOML, bare words are strings)."""
    shipped = resources.files("posttrainllm.assets") / "pretrain" / f"{name}.toml"
    if shipped.is_file():
        raw = tomllib.loads(shipped.read_text())
    elif Path(name).is_file():
        raw = tomllib.loads(Path(name).read_text())
    else:
        known = sorted(p.name.removesuffix(".toml") for p in (resources.files("posttrainllm.assets") / "pretrain")
                       .iterdir())
        raise ValueError(f"no config {name!r}: name a TOML file or one of {known}")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        try:
            value = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            pass  # a bare word: keep the string
        table, _, leaf = key.rpartition(".")
        target = raw.setdefault(table, {}) if table else raw
        target[leaf] = value
    return from_dict(raw)


def from_dict(raw: dict) -> PretrainConfig:
    """A config from its dict form (a TOML file's, or ``asdict``'s); unknown keys are refused."""
    raw = dict(raw)
    model = raw.pop("model", {})
    for given, allowed in ((raw, PretrainConfig), (model, GPTConfig)):
        unknown = sorted(set(given) - {f.name for f in fields(allowed)})
        if unknown:
            raise ValueError(f"unknown {allowed.__name__} keys {unknown}")
    _check_fields(GPTConfig, model, "model.")  # before GPTConfig's own checks divide by n_head
    return PretrainConfig(model=GPTConfig(**model), **raw)


class Windows:
    """Token ids cut into ``len // (block + 1)`` fixed windows; sample ``i`` is window
    ``perm_e[i mod n]`` of epoch ``e = i // n``, ``perm_e`` a permutation seeded by ``(seed, e)``."""

    def __init__(self, ids: np.ndarray, block_size: int, seed: int, vocab_size: int | None = None) -> None:
        self.ids, self.span, self.seed, self.vocab_size = ids, block_size + 1, seed, vocab_size
        self.n = len(ids) // self.span
        if self.n < 1:
            raise ValueError(f"{len(ids)} tokens do not fill one window of block_size + 1 = {self.span}")
        self._epoch, self._perm = -1, None

    def rows(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``first ... first + count - 1`` as inputs and targets (count, block_size)."""
        out = np.empty((count, self.span), dtype=np.int64)
        for row, i in enumerate(range(first, first + count)):
            epoch, j = divmod(i, self.n)
            if epoch != self._epoch:
                self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
            start = int(self._perm[j]) * self.span
            out[row] = self.ids[start : start + self.span]
        if self.vocab_size is not None:  # checked as read too: run() may be given ids no check has seen
            _check_id_range(out.min(), out.max(), self.vocab_size)
        block = torch.from_numpy(out)
        return block[:, :-1].contiguous(), block[:, 1:].contiguous()


def token_ids(data: str, held_out: bool = False) -> np.ndarray:
    """The token stream: ``builtin`` (module 7's oracle corpus: its first 90%, or with ``held_out``
    its last 10%), or a ``.npy`` file, memory-mapped so each process reads only the windows it
    trains on."""
    if data == "builtin":
        from posttrainllm.model import oracle_setup

        return oracle_setup().val_ids if held_out else oracle_setup().train_ids
    path = Path(data)
    if path.suffix != ".npy" or not path.is_file():
        raise ValueError(f"{data!r} is neither 'builtin' nor an existing .npy file of token ids")
    ids = np.load(path, mmap_mode="r", allow_pickle=False)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{path} holds {ids.dtype} of shape {ids.shape}, not a 1-D array of token ids")
    return ids


def _check_id_range(low: int, high: int, vocab_size: int) -> None:
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise RunError(f"token id {bad} is outside the model's vocabulary of {vocab_size} (0 to {vocab_size - 1}): "
                       "the data and model.vocab_size do not belong together")


class RunError(ValueError):
    """What stops a run for a reason its user can fix (busy folder, full disk, data, a checkpoint):
    the command line says it in one line, without a traceback."""


def check(config: PretrainConfig) -> None:
    """Everything that can be wrong before the first step, checked at once so that no process starts
    on it: the device, the data (its file, its shape, every id within the vocabulary, enough ids for
    one window), the run folder (a folder that can be written, and a checkpoint in it of this
    model's shape). Raises ``RunError`` naming the first problem."""
    try:
        resolve_device(config.device or os.environ.get(ENV) or "auto")
    except ValueError as err:
        raise RunError(str(err)) from None
    for name, data in (("data", config.data), ("val_data", config.val_data if config.eval_every else "")):
        if data:
            _check_ids(name, data, config.model)
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise RunError(f"out={config.out!r} is a file: name a folder for the run's log and checkpoints")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"out={config.out!r}: the run's folder cannot be made: {err.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise RunError(f"out={config.out!r} cannot be written")
    newest = latest(out)
    if newest is not None:
        resume_state(newest, config.model)


def _check_ids(name: str, data: str, model: GPTConfig) -> None:
    """``data`` (the setting ``name``) can be read, fills one window, and holds only ids of the vocabulary."""
    try:
        ids = token_ids(data, held_out=name == "val_data")
    except ValueError as err:
        raise RunError(f"{name}: {err}") from None
    span = model.block_size + 1
    if len(ids) < span:
        raise RunError(f"{name}={data!r}: {len(ids)} tokens do not fill one window of model.block_size + 1 = {span}")
    chunk = 1 << 24  # the file may be larger than memory: its range is read a slice at a time
    low, high = zip(*((int(part.min()), int(part.max())) for part in
                      (ids[i : i + chunk] for i in range(0, len(ids), chunk))), strict=True)
    _check_id_range(min(low), max(high), model.vocab_size)


# --- processes -------------------------------------------------------------------------------


@dataclass
class Launch:
    rank: int
    world: int
    device: str
    distributed: bool


def start(config: PretrainConfig) -> Launch:
    """Join torchrun's process group (NCCL on CUDA, gloo otherwise) or run as one process."""
    wanted = resolve_device(config.device or os.environ.get(ENV) or "auto")
    if "RANK" not in os.environ:
        return Launch(0, 1, wanted, False)
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if wanted.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        device = wanted
        dist.init_process_group("gloo")
    return Launch(rank, world, device, True)


def wrap(model: GPT, config: PretrainConfig, launch: Launch) -> torch.nn.Module:
    if not launch.distributed:
        return model
    if config.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(launch.device).index] if launch.device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(launch.device.split(":")[0], (launch.world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if config.precision == "bf16" else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def _sync(wrapped: torch.nn.Module, on: bool):
    """Gradient sync on or off for the next backward: DDP's ``no_sync``, FSDP2's flag. Off (a
    micro-batch before the step's last), FSDP2 also keeps the weights its backward gathered, so
    the next forward need not gather them again; the last backward reshards them for the step."""
    if hasattr(wrapped, "set_requires_gradient_sync"):
        wrapped.set_requires_gradient_sync(on)
        wrapped.set_reshard_after_backward(on)
        return contextlib.nullcontext()
    if hasattr(wrapped, "no_sync") and not on:
        return wrapped.no_sync()
    return contextlib.nullcontext()


def _autocast(config: PretrainConfig, launch: Launch):
    """bf16 matmuls; autocast keeps the softmax and the loss in fp32 (under FSDP2 too, whose policy
    already hands the blocks bf16 weights)."""
    if config.precision == "bf16":
        return torch.autocast(launch.device.split(":")[0], dtype=torch.bfloat16)
    return contextlib.nullcontext()


# --- checkpoints -----------------------------------------------------------------------------


@contextlib.contextmanager
def _one_process_quiet(launch: Launch):
    """DCP warns that it "assumes" one process when there is no process group: here that is meant."""
    with warnings.catch_warnings():
        if not launch.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _gather(value, launch: Launch) -> list:
    if not launch.distributed:
        return [value]
    out = [None] * launch.world
    dist.all_gather_object(out, value)
    return out


def save(directory: Path, model: GPT, optimizer: torch.optim.Optimizer, step: int, samples: int,
         config: PretrainConfig, launch: Launch) -> None:
    """Write ``directory`` (one step's checkpoint) from every process: DCP shards, then ``state.pt``.
    A save that fails for want of disk space removes what it wrote and raises ``RunError`` naming
    the last good checkpoint; other failures are raised as they come."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    both = {"model": model_state, "optimizer": optim_state}
    try:
        with _one_process_quiet(launch):
            dcp.save(both, checkpoint_id=str(directory / "dcp"), no_dist=not launch.distributed)
        _finish_save(directory, step, samples, config, launch)
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        if isinstance(err, KeyboardInterrupt | SystemExit):
            raise
        _disk_full(directory, _bytes(both), err, launch)
        raise


def _finish_save(directory: Path, step: int, samples: int, config: PretrainConfig, launch: Launch) -> None:
    rngs = _gather(_rng_state(), launch)
    if launch.rank == 0:
        files = {p.name: _sha256(p) for p in sorted((directory / "dcp").iterdir())}
        save_file({"format": STATE_FORMAT, "step": step, "samples": samples, "world_size": launch.world,
                   "config": json.dumps(asdict(config)), "rng": rngs, "files": files}, directory / "state.pt")
    if launch.distributed:
        dist.barrier()


def _bytes(state) -> int:
    """The bytes of every tensor in a nested state dict (what a checkpoint of it writes, about)."""
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state  # a DTensor: this process's shard
        return local.numel() * local.element_size()
    if isinstance(state, dict):
        return sum(_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(_bytes(v) for v in state)
    return 0


def _disk_full(directory: Path, needed: int, err: BaseException, launch: Launch) -> None:
    """Raise ``RunError`` if ``err`` came from a full disk: an ``ENOSPC``, or (torch's writers say
    "enforce fail" instead) less space left than the checkpoint needs. Its partial files go first."""
    if launch.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)  # never a checkpoint: its state.pt is written last
    free = shutil.disk_usage(directory.parent).free
    if getattr(err, "errno", None) != errno.ENOSPC and free >= needed:
        return
    last = latest(directory.parent)
    raise RunError(f"could not save {directory.name}: the disk holding {directory.parent} is full ({free:,} bytes "
                   f"free, a checkpoint needs about {needed:,}). "
                   + (f"The last good checkpoint is {last.name}; free some space and run again to resume from it."
                      if last else "No checkpoint was saved; free some space and run again."))


def checkpoints(out: Path) -> list[Path]:
    """The complete checkpoints under ``out`` (those whose ``state.pt`` was written), newest first:
    by step number, compared as a number (``step-1000000`` after ``step-999999``); a folder whose
    name is not ``step-`` and digits is not a checkpoint of this trainer."""
    done = [(int(m[1]), p.parent) for p in out.glob("step-*/state.pt")
            if (m := re.fullmatch(r"step-([0-9]+)", p.parent.name))]
    return [path for _, path in sorted(done, reverse=True)]


def latest(out: Path) -> Path | None:
    """The newest complete checkpoint under ``out``, if any."""
    found = checkpoints(out)
    return found[0] if found else None


def _earlier_whole(checkpoint: Path) -> str:
    """What to do when ``checkpoint`` (the newest) is damaged: the newest whole one before it."""
    whole = next((c for c in checkpoints(checkpoint.parent) if c.name != checkpoint.name and _whole(c)), None)
    if whole is None:
        return " No earlier checkpoint is whole."
    return (f" {whole.name} is whole: move {checkpoint.name} out of {checkpoint.parent} to resume from "
            f"step {int(whole.name[5:])}")


def _whole(checkpoint: Path) -> bool:
    try:
        read_state(checkpoint)
    except ValueError:
        return False
    return True


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's index (``.metadata``) is a pickle: admit only DCP's own classes and plain values."""

    PLAIN = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
             ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("builtins", "set"), ("builtins", "slice")}

    def find_class(self, module: str, name: str):
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format)
        if (module, name) in self.PLAIN or dtype or module.startswith("torch.distributed.checkpoint."):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the checkpoint's index names {module}.{name}, which no DCP index holds")


def _reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = _MetadataUnpickler(io.BytesIO((path / ".metadata").read_bytes())).load()
            from torch.distributed.checkpoint.metadata import StorageMeta

            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def read_state(directory: Path) -> dict:
    """``state.pt`` of a checkpoint, after checking every DCP file against the hashes it lists."""
    directory = Path(directory)
    state = load_file(directory / "state.pt", STATE_FORMAT, "pretraining checkpoint", "checkpoint state")
    missing = sorted({"step", "samples", "world_size", "config", "rng", "files"} - set(state))
    if missing:
        raise ValueError(f"{directory}: state.pt lacks {', '.join(missing)}: not a whole checkpoint of this trainer")
    for name, digest in state["files"].items():
        path = directory / "dcp" / name
        if not path.is_file():
            raise ValueError(f"{directory}: {path.name} is missing: the checkpoint is incomplete")
        if _sha256(path) != digest:
            raise ValueError(f"{directory}: {path.name} differs from what was saved (truncated or damaged)")
    return state


def resume_state(directory: Path, shape: GPTConfig) -> dict:
    """``read_state(directory)`` for a run of a model of config ``shape``; a damaged checkpoint, or one
    of another shape, raises ``RunError`` (naming the newest whole checkpoint before a damaged one)."""
    try:
        state = read_state(directory)
    except ValueError as err:
        raise RunError(f"{err}.{_earlier_whole(Path(directory))}") from None
    saved = json.loads(state["config"])["model"]
    # the seed only draws the initial weights, which the checkpoint replaces: not part of the shape
    if {k: v for k, v in saved.items() if k != "seed"} != {k: v for k, v in asdict(shape).items() if k != "seed"}:
        raise RunError(f"{directory} holds a model of another shape {saved}: give this run its own out=")
    return state


def load(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, launch: Launch,
         shape: GPTConfig) -> dict:
    """Fill ``model`` (a GPT of config ``shape``, already wrapped for this world size) and
    ``optimizer`` from ``directory``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    state = resume_state(directory, shape)
    model_state, optim_state = get_state_dict(model, optimizer)
    both = {"model": model_state, "optimizer": optim_state}
    with _one_process_quiet(launch):
        dcp.load(both, storage_reader=_reader(directory / "dcp"), no_dist=not launch.distributed)
    set_state_dict(model, optimizer, model_state_dict=both["model"], optim_state_dict=both["optimizer"])
    if state["world_size"] == launch.world:  # each process continues its own random stream
        _set_rng_state(state["rng"][launch.rank])
    return state


# --- the loop --------------------------------------------------------------------------------


def _log(out: Path, step: int, record: dict | None = None) -> None:
    """``log.jsonl``: one line per step; on resume, lines past the checkpoint's step are dropped."""
    path = out / "log.jsonl"
    if record is None:
        kept = [line for line in _log_lines(path) if json.loads(line)["step"] <= step]
        atomic.write_text(path, "".join(line + "\n" for line in kept))
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _log_lines(path: Path) -> list[str]:
    """The whole lines of ``log.jsonl``; a torn or blank line (what a crash during an append
    leaves) is dropped with a warning, since the checkpoint, not the log, is what resumes."""
    if not path.exists():
        return []
    lines = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            if isinstance(json.loads(line).get("step"), int):
                lines.append(line)
                continue
        except (json.JSONDecodeError, AttributeError):
            pass
        warnings.warn(f"{path}: line {number} is not a whole log record ({line[:40]!r}); dropped", stacklevel=2)
    return lines


def run(config: PretrainConfig) -> list[float]:
    """Train (resuming from the newest checkpoint in ``config.out`` if there is one); return the
    losses of the steps this call ran. Rank 0 shows a progress bar and appends to ``log.jsonl``."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    with _sole_writer(out, int(os.environ.get("RANK", "0"))):
        launch = start(config)
        try:
            return _train(config, launch)
        finally:
            if launch.distributed:
                dist.destroy_process_group()


@contextlib.contextmanager
def _sole_writer(out: Path, rank: int):
    """Rank 0 holds ``out``'s lock for the whole run: a second run into the same folder is refused,
    not left to interleave its log lines and checkpoints with the first's."""
    with contextlib.ExitStack() as held:
        if rank == 0:
            try:
                held.enter_context(atomic.locked(out / "log.jsonl", wait=False))
            except BlockingIOError:
                raise RunError(f"out={str(out)!r} is in use by another run: wait for it to end, or give this "
                               "run its own out=") from None
        yield


def _train(config: PretrainConfig, launch: Launch) -> list[float]:
    out = Path(config.out)
    torch.manual_seed(config.seed + launch.rank)
    windows = Windows(token_ids(config.data), config.model.block_size, config.seed, config.model.vocab_size)
    val = Windows(token_ids(config.val_data, held_out=True), config.model.block_size, config.seed,
                  config.model.vocab_size) if config.eval_every else None
    model = GPT(config.model).to(PRECISIONS[config.precision]).to(launch.device)
    if config.compile:
        model.compile()
    wrapped = wrap(model, config, launch)
    optimizer = AdamW(wrapped.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    step, samples = 0, 0
    checkpoint = latest(out)
    if checkpoint is not None:
        state = load(checkpoint, wrapped, optimizer, launch, model.config)
        step, samples = state["step"], state["samples"]
        if launch.rank == 0:
            _log(out, step)
    share = config.micro_batch * config.grad_accum  # rows per process per step
    losses: list[float] = []
    bar = range(step, config.steps)
    if config.progress and launch.rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(bar, initial=step, total=config.steps, desc="pretraining", file=sys.stderr)
    for step in bar:
        began = time.perf_counter()
        lr = warmup_cosine(step, config.lr, config.warmup, config.steps, config.min_lr)
        set_lr(optimizer, lr)
        loss = torch.zeros((), dtype=torch.float64, device=launch.device)
        first = samples + launch.rank * share
        for micro in range(config.grad_accum):
            x, y = windows.rows(first + micro * config.micro_batch, config.micro_batch)
            with _sync(wrapped, micro == config.grad_accum - 1):
                with _autocast(config, launch):  # the forward only: backward follows the forward's dtypes
                    _, micro_loss = wrapped(x.to(launch.device), y.to(launch.device))
                (micro_loss / config.grad_accum).backward()
            loss += micro_loss.detach().double() / config.grad_accum
        samples += share * launch.world
        if launch.distributed:  # before the step: every process must agree on a non-finite loss
            dist.all_reduce(loss)
            loss /= launch.world
        norm = clip_grad_norm(model.parameters(), config.max_grad_norm) if config.max_grad_norm else None
        done = step + 1
        skipped = not math.isfinite(loss.item()) or (norm is not None and not math.isfinite(norm))
        if skipped and config.nonfinite == "stop":
            raise RunError(f"step {done}: the loss is {loss.item()} and the gradient norm {norm}. Stopped before the "
                           "optimizer step, so the weights are untouched and the newest checkpoint is good; lower lr, "
                           "or set nonfinite=skip to skip such batches")
        if not skipped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        record = {"step": done, "loss": losses[-1], "lr": lr, "grad_norm": norm,
                  "tokens_per_s": share * launch.world * config.model.block_size / (time.perf_counter() - began)}
        if skipped:
            record["skipped"] = True
        if config.eval_every and done % config.eval_every == 0:
            record["val_loss"] = _val_loss(wrapped, val, config, launch)
        if launch.rank == 0:
            _log(out, done, record)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if config.stop_after and done == config.stop_after:
            return losses
        if done == config.steps or (config.save_every and done % config.save_every == 0):
            save(out / f"step-{done:06d}", wrapped, optimizer, done, samples, config, launch)
            if config.keep and launch.rank == 0:
                for old in checkpoints(out)[config.keep :]:
                    shutil.rmtree(old)
    return losses


VAL_ROWS = 64  # the validation loss's windows: the first 64 of the held-out stream, the same every time


@torch.no_grad()
def _val_loss(wrapped: torch.nn.Module, val: Windows, config: PretrainConfig, launch: Launch) -> float:
    """The mean loss on the held-out stream's first :data:`VAL_ROWS` windows (fewer if it has fewer),
    shared out evenly, ``micro_batch`` rows a forward: under FSDP2 every process must run as many
    forwards as the others, since each gathers weights from all of them."""
    per = max(1, min(VAL_ROWS, val.n) // launch.world)  # rows per process
    total = torch.zeros((), dtype=torch.float64, device=launch.device)
    for first in range(launch.rank * per, (launch.rank + 1) * per, config.micro_batch):
        count = min(config.micro_batch, (launch.rank + 1) * per - first)
        x, y = val.rows(first, count)
        with _autocast(config, launch):
            total += wrapped(x.to(launch.device), y.to(launch.device))[1].double() * count
    if launch.distributed:
        dist.all_reduce(total)
    return total.item() / (per * launch.world)


def launch(out: str | Path, overrides: list[str], processes: int = 1, config: str = "tiny",
           timeout: float = 600, torchrun: bool | None = None) -> list[float]:
    """Run the trainer in fresh processes, as a notebook or a test would from a shell: under
    ``torchrun`` (rendezvous on 127.0.0.1, a free port) when ``processes`` > 1 or ``torchrun`` is
    true, else as one plain process. Return the loss of every step in ``out``'s log; a failed run
    raises ``RuntimeError`` with the end of its stderr."""
    import subprocess

    prefix = _torchrun(processes) if processes > 1 or torchrun else []
    command = [sys.executable, *prefix, "-m", "posttrainllm.pretrain", "--config", config, f"out={out}",
               "progress=false", *overrides]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if done.returncode:
        raise RuntimeError(f"the trainer failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(line)["loss"] for line in _log_lines(Path(out) / "log.jsonl")]


def _torchrun(processes: int) -> list[str]:
    """``python`` arguments that start torchrun with ``processes`` processes on this machine, its
    rendezvous on 127.0.0.1 at a free port."""
    from posttrainllm.distributed import free_port

    return ["-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}"]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m posttrainllm.pretrain", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny", help="a shipped config (tiny, gpt2-small) or a TOML file")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="start N processes under torchrun, once the settings, data and folder are checked")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. steps=20 model.n_layer=4 parallel=fsdp")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        check(config)
    except (ValueError, TypeError) as err:
        return _refuse(parser.prog, err)
    if args.processes > 1 and "RANK" not in os.environ:
        import subprocess

        command = [sys.executable, *_torchrun(args.processes), "-m", "posttrainllm.pretrain", "--config",
                   args.config, *args.overrides]
        return subprocess.run(command, check=False).returncode
    try:
        run(config)
    except RunError as err:  # any other error is the trainer's own fault: its traceback is kept
        return _refuse(parser.prog, err)
    return 0


def _refuse(prog: str, err: Exception) -> int:
    """One line, from one process: under torchrun every process meets the same problem."""
    if os.environ.get("RANK", "0") == "0":
        print(f"{prog}: error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
