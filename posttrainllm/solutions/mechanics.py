"""Module 8's exercises, answered. The AdamW update, the schedule and the accumulated step are the
package's own (:mod:`posttrainllm.optim`, :mod:`posttrainllm.train`), which every later module
trains with; loss scaling and the largest safe scale are written here."""

from __future__ import annotations

import numpy as np

from posttrainllm.optim import adamw_update, warmup_cosine
from posttrainllm.train import accumulated_step

__all__ = ["accumulated_step", "adamw_update", "largest_safe_scale", "scaler_step", "warmup_cosine"]


def scaler_step(grads: list[np.ndarray], scale: float, good_steps: int,
                growth_interval: int) -> tuple[list[np.ndarray] | None, float, int]:
    """One step of dynamic loss scaling: the gradients divided back by ``scale``, or ``None`` when
    one of them is not finite (the step is skipped and the scale halved); the scale doubles after
    ``growth_interval`` good steps in a row."""
    grads = [g / scale for g in grads]
    if not all(np.isfinite(g).all() for g in grads):
        return None, scale / 2, 0
    good_steps += 1
    if good_steps == growth_interval:
        return grads, scale * 2, 0
    return grads, scale, good_steps


def largest_safe_scale(grads: np.ndarray) -> float:
    """The largest power of two that multiplies ``grads`` without a value overflowing fp16."""
    exponent = 0
    with np.errstate(over="ignore"):  # the first scale too far overflows: that is the test
        while np.isfinite((grads * 2.0 ** (exponent + 1)).astype(np.float16)).all():
            exponent += 1
    return 2.0**exponent
