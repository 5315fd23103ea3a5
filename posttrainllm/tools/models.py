"""The notebooks' shared models: every cached model a notebook or a computed chapter loads, and
:func:`build_all`, which ``posttrainllm models`` (and so ``make book`` and ``make test``) runs
first, so that no notebook or chapter pays for training inside a timed cell.

Each model trains once into the cache (``POSTTRAINLLM_CACHE``) and is read from it afterwards.
While one trains, its loops draw a bar (:mod:`posttrainllm.progress`), and each model's line says
how long it took on the machine that measured ``assets/model_times.json``, with the total that is
left: an upper bound, since a model already in the cache loads in about a second.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from datetime import date
from importlib import resources
from pathlib import Path
from typing import TextIO

from posttrainllm import atomic, curation, distill, progress, reward_model, rl, tuned
from posttrainllm.pretrained import SPECULATIVE_DRAFT, SPECULATIVE_TARGET, base_model

# modules 7–10's base model, module 10's speculative-decoding target and draft, module 9's
# fine-tuned models (which module 10 scores again), and the reference shelf's models: the post-training
# data chapter's SFT runs, one per curation stage, and the reward-models chapter's reward models and students
MODELS: dict[str, Callable[[], object]] = {
    "base": lambda: base_model(),
    "speculative target (6 blocks, width 128)": lambda: base_model(SPECULATIVE_TARGET),
    "speculative draft (1 block, width 32)": lambda: base_model(SPECULATIVE_DRAFT),
    **{f"SFT, {f'LoRA r={r}' if r else 'all weights'}": (lambda r=r: tuned.sft_model(rank=r))
       for r in (None, 1, 2, 4, 8)},
    **{f"DPO, NLL weight {w:g}": (lambda w=w: tuned.dpo_model(nll_weight=w)) for w in (0.0, 1.0)},
    **{f"GRPO, {reward.split(':')[0]} reward": (lambda reward=reward: tuned.grpo_model(reward))
       for reward in rl.REWARDS},
    **{f"SFT on planted data, {stage}": (lambda stage=stage: curation.stage_model(stage)) for stage in curation.STAGES},
    **{f"reward model, {n or 'all'} pairs": (lambda n=n: reward_model.cached(n, steps=60 if n else 200))
       for n in (None, 20)},
    **{f"student, {'distilled' if d else 'labels'}": (lambda d=d: distill.student(d)) for d in (False, True)},
}


def measured() -> dict:
    """``{"machine", "date", "seconds": {model: s}}``: each model's training time from an empty cache."""
    return json.loads(resources.files("posttrainllm.assets").joinpath("model_times.json").read_text("utf-8"))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def build_all(out: TextIO | None = None, record: Path | None = None) -> dict[str, float]:
    """Train (or read from the cache) every model in :data:`MODELS`, in order; return the seconds
    each took. ``out`` gets a line before and after each model; ``record`` writes the times as a
    new ``model_times.json`` (run it on an empty cache)."""
    times = measured()
    expected, names, taken = times["seconds"], list(MODELS), {}

    def say(line: str) -> None:
        if out is not None:
            print(line, file=out, flush=True)

    for i, name in enumerate(names):
        left = sum(expected.get(n, 0.0) for n in names[i:])
        say(f"[{i + 1}/{len(names)}] {name}: {_duration(expected.get(name, 0.0))} to train on {times['machine']} "
            f"(up to {_duration(left)} for this and the rest; cached ones take a second)")
        start = time.perf_counter()
        with progress.shown(name):
            MODELS[name]()
        taken[name] = time.perf_counter() - start
        say(f"      {name}: ready in {taken[name]:.1f} s")
    if record is not None:
        machine = f"{platform.machine()}, {_cores()} CPU cores"
        report = {"machine": machine, "date": date.today().isoformat(),
                  "seconds": {n: round(s, 1) for n, s in taken.items()}}
        atomic.write_text(record, json.dumps(report, indent=2) + "\n")
    return taken


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
