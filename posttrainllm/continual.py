"""Module 10: continual learning — improve a deployed model from its own usage, on the device.

The loop: the model answers; when an answer is wrong and the user corrects it, the correction is
appended to a local log (a JSON-lines file that never leaves the machine); every so often a
fresh LoRA adapter is trained on everything the log holds, mixed with a *replay* sample of the
original fine-tuning data so the new adapter does not forget what the old one knew, and it
replaces the old adapter. The base model never changes, so a bad refresh is undone by switching
back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from posttrainllm import lora
from posttrainllm.model import GPT
from posttrainllm.sft import Example, reply, train_sft
from posttrainllm.tokenizer import Tokenizer


@dataclass(frozen=True)
class Correction:
    prompt: str
    given: str  # what the model said
    correct: str  # what the user said it should have been


class FeedbackLog:
    """Corrections, one JSON object per line, appended as they arrive (a crash loses at most the
    line being written; a damaged line is reported with its number, not silently skipped)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, correction: Correction) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(correction)) + "\n")

    def corrections(self) -> list[Correction]:
        if not self.path.exists():
            return []
        out = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            try:
                out.append(Correction(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as err:
                raise ValueError(f"{self.path}, line {number}: not a correction record ({err})") from None
        return out


def serve(model: GPT, tokenizer: Tokenizer, requests: list[Example], log: FeedbackLog) -> float:
    """Answer ``requests``; log a correction for every wrong answer. Returns the accuracy served."""
    right = []
    for request in requests:
        given = reply(model, tokenizer, request.prompt).strip()
        right.append(given == request.response)
        if given != request.response:
            log.append(Correction(request.prompt, given, request.response))
    return float(np.mean(right))


def refresh(model: GPT, tokenizer: Tokenizer, log: FeedbackLog, replay: list[Example], name: str,
            targets: tuple[str, ...], rank: int = 4, steps: int = 300, lr: float = 3e-3, seed: int = 0) -> None:
    """Train a new adapter ``name`` on all logged corrections plus ``replay``, and switch to it."""
    fixes = [Example(c.prompt, c.correct, "correction") for c in log.corrections()]
    lora.inject(model, targets, rank=rank, alpha=2 * rank, name=name, seed=seed)
    train_sft(model, tokenizer, fixes + replay, steps=steps, lr=lr, seed=seed)
