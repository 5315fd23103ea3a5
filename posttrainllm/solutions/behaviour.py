"""Module 9's exercises, answered: the SFT targets, the LoRA layer and its merge, the response
log-probability, the DPO loss, and the rank that holds most of a fine-tune's change."""

from __future__ import annotations

import numpy as np

from posttrainllm.preference import dpo_objective as dpo_loss
from posttrainllm.preference import response_logprob
from posttrainllm.sft import render_ids as sft_targets

__all__ = ["dpo_loss", "energy_rank", "lora_forward", "merge", "response_logprob", "sft_targets"]


def lora_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray, A: np.ndarray, B: np.ndarray, alpha: float,
                 r: int) -> np.ndarray:
    """The frozen layer plus the adapter's low-rank path, scaled by ``alpha / r``."""
    return x @ W.T + b + (alpha / r) * (x @ A.T) @ B.T


def merge(W: np.ndarray, A: np.ndarray, B: np.ndarray, alpha: float, r: int) -> np.ndarray:
    """The adapter folded into its frozen weight: the same outputs, no extra matmuls."""
    return W + (alpha / r) * B @ A


def energy_rank(delta: np.ndarray, share: float) -> int:
    """The smallest rank whose best approximation of ``delta`` keeps ``share`` of its energy."""
    singular = np.linalg.svd(delta, compute_uv=False)
    energy = np.cumsum(singular**2) / np.sum(singular**2)
    return int(np.searchsorted(energy, share)) + 1
