"""Knowledge distillation of a fine-tuned model into a smaller one (the reward-models chapter,
``book/reward-models.md``).

Hinton, Vinyals and Dean (*Distilling the Knowledge in a Neural Network*, 2015) train a small
*student* on a large *teacher*'s output distribution instead of on the one right label: the
teacher's probabilities for the wrong answers carry information the label does not. For a
language model this is token-level distillation: at every response position, minimise the KL
divergence from the teacher's next-token distribution to the student's (Kim and Rush, 2016,
compare it with training on the teacher's own outputs). Both models must share a tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from posttrainllm import sft, tuned
from posttrainllm.model import GPT, log_probs
from posttrainllm.pretrained import SPECULATIVE_DRAFT, base_model
from posttrainllm.sft import END, IGNORE, Example, pack, render, train_sft
from posttrainllm.tokenizer import Tokenizer


def token_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, targets: torch.Tensor,
             temperature: float = 1.0) -> torch.Tensor:
    """Mean ``KL(teacher || student)`` over the positions whose target is not ``IGNORE``, both
    distributions softened by ``temperature`` (the loss is multiplied by its square, as in Hinton
    et al., so that its gradient keeps the same scale)."""
    mask = targets != IGNORE
    teacher = log_probs(teacher_logits[mask] / temperature)
    student = log_probs(student_logits[mask] / temperature)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature**2


def train_distill(student: GPT, teacher: GPT, tokenizer: Tokenizer, train_set: list[Example], steps: int,
                  batch_size: int = 16, lr: float = 3e-3, temperature: float = 1.0, seed: int = 0) -> list[float]:
    """Train ``student`` on the teacher's distributions over ``train_set``'s responses, drawing rows
    as :func:`posttrainllm.sft.train_sft` does (it is that loop, with this loss); returns the loss per step."""
    if student.config.vocab_size != teacher.config.vocab_size:
        raise ValueError(f"student and teacher must share a vocabulary: {student.config.vocab_size} tokens "
                         f"against {teacher.config.vocab_size}")
    teacher.eval()

    def loss_fn(model: GPT, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = teacher(inputs)
        return token_kl(teacher_logits, model(inputs), targets, temperature)

    return train_sft(student, tokenizer, train_set, steps, batch_size, lr, seed, loss_fn=loss_fn)


@torch.no_grad()
def held_out_kl(student: GPT, teacher: GPT, tokenizer: Tokenizer, examples: list[Example]) -> float:
    """Mean per-token ``KL(teacher || student)`` on the responses of ``examples``."""
    inputs, targets = pack([render(tokenizer, e) for e in examples], student.config.block_size,
                           tokenizer.special_tokens[END])
    return float(token_kl(teacher(inputs), student(inputs), targets))


def student(distilled: bool, steps: int = 600, cache_dir: Path | None = None) -> tuple[GPT, dict]:
    """The reward-models chapter's students, cached: module 10's speculative-decoding draft (1 block,
    width 32) fine-tuned for ``steps`` steps at lr 3e-3 on module 9's 2,000 training questions,
    from the labels (``distilled=False``, plain SFT) or from module 9's full SFT model's
    distributions. Returns ``(model, {"loss": [...]})``."""

    def fit(model: GPT) -> dict:
        tokenizer, train_set = base_model(cache_dir=cache_dir)[1], sft.examples("questions", 2000)
        if distilled:
            teacher = tuned.sft_model(None, cache_dir=cache_dir)[0]
            return {"loss": train_distill(model, teacher, tokenizer, train_set, steps=steps, lr=3e-3)}
        return {"loss": train_sft(model, tokenizer, train_set, steps=steps, lr=3e-3)}

    name = f"student-{'distilled' if distilled else 'labels'}-{steps}-{SPECULATIVE_DRAFT.key}"
    return tuned._tuned(name, lambda: base_model(SPECULATIVE_DRAFT, cache_dir)[0], fit, cache_dir)
