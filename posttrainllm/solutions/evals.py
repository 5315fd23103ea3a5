"""Module 10's exercises, answered: the SAE's training step, speculative decoding's accept rule and
its expected tokens per target forward, the two pieces of GRPO's objective, and McNemar's test.
Each is the package's own, which the notebook's runs use when the reader's has not passed yet."""

from __future__ import annotations

import torch

from posttrainllm.comparison import mcnemar_p
from posttrainllm.rl import group_advantages
from posttrainllm.rl import grpo_loss as _grpo_loss
from posttrainllm.sae import sae_step
from posttrainllm.speculative import expected_tokens_per_forward as expected_tokens
from posttrainllm.speculative import verify

__all__ = ["expected_tokens", "group_advantages", "grpo_loss", "mcnemar_p", "sae_step", "verify"]


def grpo_loss(new: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor,
              advantages: torch.Tensor, clip: float, kl_coef: float) -> torch.Tensor:
    """The clipped objective with the k3 KL penalty, as a loss over the tokens in ``mask`` (their
    mean): :func:`posttrainllm.rl.grpo_loss` with its default aggregation."""
    return _grpo_loss(new, old, ref, mask, advantages, clip=clip, kl_coef=kl_coef)[0]
