"""Module 9: supervised fine-tuning — a chat format, loss masking, packing, and a task set whose
answers can be checked exactly.

A pretrained model continues text. To make it *answer*, fine-tune it on conversations rendered
with special tokens::

    <|user|> prompt <|assistant|> response <|endoftext|>

and train only on the response: the prompt's positions get the target ``-100``, which
``cross_entropy`` ignores, so the model is never taught to produce the user's words — only to
reply to them. Short examples are **packed** several to a row of ``block_size`` tokens so no
compute goes to padding (a packed example can attend to the one before it in its row; that
leak is harmless here because every example is self-contained).

The tasks come from the corpus's story plans (``posttrainllm.data.plan``), so every answer is
known exactly:

- ``questions``: a story's event sentence, then a question about it ("What did Ada lose?",
  "Where was it?", "Who lost a brass key?"); the answer is a span of the sentence.
- ``storybook``: the plain sentence of thanks ("Ivy smiled and thanked Mira.") to be retold in
  the corpus's second, older register, which the base model never read — a style with one
  exactly right rewrite, since the two registers tell the same story beat by beat.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from posttrainllm import data
from posttrainllm import progress as bars
from posttrainllm.model import GPT
from posttrainllm.optim import AdamW
from posttrainllm.tokenizer import Tokenizer
from posttrainllm.train import greedy

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|endoftext|>"
CHAT_TOKENS = (END, USER, ASSISTANT)
IGNORE = -100  # cross_entropy's ignore_index: no loss, no gradient at this position
TASKS = ("questions", "storybook")


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str
    task: str


_BASE_VERB = {"lost": "lose", "broke": "break", "forgot": "forget", "dropped": "drop"}


SPLITS = {"train": 0, "test": 1_000_000}  # where each split's story indices start


def _held_out(plan: dict) -> bool:
    """One in five (hero, friend) name pairs is kept for testing, so a held-out example is never
    a pair of names the model was fine-tuned on."""
    return (data.NAMES.index(plan["hero"].name) * 7 + data.NAMES.index(plan["friend"].name)) % 5 == 0


def examples(task: str, n: int, split: str = "train", seed: int = 0) -> list[Example]:
    """``n`` examples of ``task`` from the ``split``'s stories: the two splits share no story and
    no (hero, friend) name pair."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {tuple(SPLITS)}, got {split!r}")
    out, i = [], SPLITS[split]
    while len(out) < n:
        p = data.plan(i, seed)
        if _held_out(p) == (split == "test"):
            out.append(_example(task, i, seed, p))
        i += 1
    return out


def _example(task: str, i: int, seed: int, p: dict) -> Example:
    plain = data.sentences(i, seed, "plain")
    if task == "storybook":  # the thanks: the one beat short enough for a 64-token context
        return Example(f"Tell it the old way: {plain[7]}", data.sentences(i, seed, "storybook")[7], task)
    hero, (verb, _) = p["hero"].name, p["problem"]
    question, answer = [
        (f"What did {hero} {_BASE_VERB[verb]}?", p["object"]),
        ("Where was it?", data.PLACES[p["place"]][0]),
        (f"Who {verb} {p['object']}?", hero),
    ][i % 3]
    return Example(f"{plain[1]} {question}", answer, task)


def chat_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The tokens a model sees before it answers: ``<|user|> prompt <|assistant|>``."""
    specials = tokenizer.special_tokens
    missing = [t for t in CHAT_TOKENS if t not in specials]
    if missing:
        raise ValueError(f"the tokenizer has no chat tokens {missing}; use pretrained.base_model(), which adds them")
    return [specials[USER], *tokenizer.encode_ordinary(prompt), specials[ASSISTANT]]


def render(tokenizer: Tokenizer, example: Example) -> tuple[list[int], list[int]]:
    """``(inputs, targets)`` for one example, as :func:`render_ids` makes them from its tokens."""
    response = tokenizer.encode_ordinary(example.response)
    return render_ids(chat_ids(tokenizer, example.prompt), response, tokenizer.special_tokens[END])


def render_ids(prompt: list[int], response: list[int], end: int) -> tuple[list[int], list[int]]:
    """``(inputs, targets)`` from a prompt's ids (chat tokens included), a response's ids and the
    end token: the inputs are prompt and response, the targets the next token at each position,
    ``IGNORE`` wherever that token is still the prompt's, so only the response and the end token
    are trained."""
    ids = [*prompt, *response, end]
    targets = [IGNORE if t + 1 < len(prompt) else ids[t + 1] for t in range(len(ids) - 1)]
    return ids[:-1], targets


def pack(rendered: list[tuple[list[int], list[int]]], block_size: int, pad_id: int):
    """Pack rendered examples, whole, into rows of ``block_size``; pad the rest of each row with
    ``pad_id`` inputs and ignored targets. Returns ``(inputs, targets)`` tensors."""
    rows, row = [], ([], [])
    for inputs, targets in rendered:
        if len(inputs) > block_size:
            raise ValueError(f"an example of {len(inputs)} tokens does not fit block_size={block_size}")
        if len(row[0]) + len(inputs) > block_size:
            rows.append(row)
            row = ([], [])
        row[0].extend(inputs)
        row[1].extend(targets)
    rows.append(row)
    pad = [(r[0] + [pad_id] * (block_size - len(r[0])), r[1] + [IGNORE] * (block_size - len(r[1]))) for r in rows]
    return torch.tensor([r[0] for r in pad]), torch.tensor([r[1] for r in pad])


def train_sft(
    model: GPT, tokenizer: Tokenizer, train_set: list[Example], steps: int, batch_size: int = 16,
    lr: float = 1e-3, seed: int = 0, loss_fn: Callable[[GPT, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> list[float]:
    """Fine-tune the parameters that require grad (all of them, or only LoRA's) on packed rows, by
    the next-token loss on the responses, or by ``loss_fn(model, inputs, targets)`` if given (the
    distillation chapter passes a KL divergence to a teacher)."""
    inputs, targets = pack([render(tokenizer, e) for e in train_set], model.config.block_size,
                           tokenizer.special_tokens[END])
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = AdamW(trainable, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in bars.steps(steps, "SFT"):
        rows = torch.randint(0, len(inputs), (batch_size,), generator=generator)
        loss = loss_fn(model, inputs[rows], targets[rows]) if loss_fn else model(inputs[rows], targets[rows])[1]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def reply(model: GPT, tokenizer: Tokenizer, prompt: str, max_tokens: int = 48) -> str:
    """The model's greedy answer to ``prompt``, up to its end token or the context's end."""
    ids = chat_ids(tokenizer, prompt)
    room = min(max_tokens, model.config.block_size - len(ids))
    return tokenizer.decode(greedy(model, ids, room, stop=tokenizer.special_tokens[END]))


def right_answers(model: GPT, tokenizer: Tokenizer, test_set: list[Example]) -> np.ndarray:
    """Per prompt, whether the greedy reply is exactly the right response (whitespace-trimmed): the
    paired scores that :mod:`posttrainllm.comparison` compares models with."""
    return graded(greedy_replies(model, tokenizer, test_set), test_set)


def greedy_replies(model: GPT, tokenizer: Tokenizer, test_set: list[Example]) -> list[str]:
    """The model's greedy :func:`reply` to each example's prompt."""
    return [reply(model, tokenizer, e.prompt) for e in test_set]


def graded(replies: list[str], test_set: list[Example]) -> np.ndarray:
    """Per reply, whether it is exactly its example's response (whitespace-trimmed)."""
    if len(replies) != len(test_set):
        raise ValueError(f"{len(replies)} replies for {len(test_set)} examples: one reply per example is needed")
    return np.array([r.strip() == e.response for r, e in zip(replies, test_set, strict=True)], dtype=bool)


def exact_match(model: GPT, tokenizer: Tokenizer, test_set: list[Example]) -> float:
    """Fraction of prompts answered with exactly the right response (whitespace-trimmed)."""
    return float(right_answers(model, tokenizer, test_set).mean())


class StyleScore:
    """How storybook a text reads: a naive-Bayes word model of the two registers, trained on the
    corpus itself. ``score(text)`` is the probability that ``text`` is storybook rather than plain."""

    def __init__(self, n_chars: int = 200_000, seed: int = 1) -> None:
        counts = {r: Counter(self.words(data.corpus(n_chars, seed=seed, register=r))) for r in data.REGISTERS}
        vocab = set(counts["plain"]) | set(counts["storybook"])
        totals = {r: sum(c.values()) + len(vocab) for r, c in counts.items()}
        def log_p(register: str, word: str) -> float:  # add-one smoothing: unseen words are not impossible
            return math.log((counts[register][word] + 1) / totals[register])

        self.log_odds = {w: log_p("storybook", w) - log_p("plain", w) for w in vocab}

    @staticmethod
    def words(text: str) -> list[str]:
        return re.findall(r"[a-z]+", text.lower())

    def score(self, text: str) -> float:
        total = sum(self.log_odds.get(w, 0.0) for w in self.words(text))
        return 1 / (1 + math.exp(-max(-50.0, min(50.0, total))))
