"""The pretrained base model that modules 8–10 start from (module 9's fine-tuned models, built on
it, are :mod:`posttrainllm.tuned`).

:func:`base_model` trains a tokenizer and a GPT on the built-in corpus with a fixed, seeded
recipe, and caches both under the cache directory in files named by a hash of the recipe. The
first call trains (about a minute on two CPU cores); later calls — from any notebook, in
any order, in a fresh kernel — load the cached files. Files are written atomically; a damaged
cache file is rebuilt rather than trusted.

Every model here is trained and stored in float64, whatever the caller's default dtype: in
float32 the last bits of a sum depend on the CPU's vector width and thread count, and training
amplifies them into different printed losses and samples on different machines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from posttrainllm import data
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.tokenizer import Tokenizer
from posttrainllm.train import load_checkpoint, save_checkpoint, train

BUILD_VERSION = 3  # bump whenever _build or corpus_split changes what the same recipe produces


@dataclass(frozen=True)
class Recipe:
    corpus_chars: int = 400_000
    corpus_seed: int = 0
    vocab_size: int = 512
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0
    # the first ends every story in pretraining; the chat tokens are never seen until module 9
    special_tokens: tuple[str, ...] = ("<|endoftext|>", "<|user|>", "<|assistant|>")

    @property
    def key(self) -> str:
        """Names the cache files: changes with any field, and with how :func:`_build` trains."""
        fields = {**asdict(self), "build": BUILD_VERSION}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


@contextlib.contextmanager
def float64() -> Iterator[None]:
    """Create and train in float64 inside the block (or the decorated function); the caller's default
    dtype is restored after."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@float64()
def _build(recipe: Recipe) -> tuple[GPT, Tokenizer]:
    import torch

    text = data.corpus(recipe.corpus_chars, seed=recipe.corpus_seed)
    tokenizer = Tokenizer.train(text, recipe.vocab_size, special_tokens=recipe.special_tokens)
    train_ids, _ = corpus_split(tokenizer, recipe)
    torch.manual_seed(recipe.seed)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=recipe.block_size, n_layer=recipe.n_layer,
        n_head=recipe.n_head, n_embd=recipe.n_embd, seed=recipe.seed,
    )
    model = GPT(config)
    train(model, train_ids, recipe.steps, recipe.batch_size, recipe.lr, seed=recipe.seed)
    model.eval()
    return model, tokenizer


def base_model(recipe: Recipe = Recipe(), cache_dir: Path | None = None) -> tuple[GPT, Tokenizer]:
    """The base GPT and its tokenizer for ``recipe``, trained once and then read from the cache."""
    cache = Path(cache_dir or data.default_cache_dir())
    weights, vocab = cache / f"base-{recipe.key}.pt", cache / f"base-{recipe.key}.bpe"
    if (cached := _cached_base(weights, vocab)) is not None:
        return cached
    with data.training_into(cache, weights):
        if (cached := _cached_base(weights, vocab)) is not None:
            return cached  # another process trained it while this one waited
        model, tokenizer = _build(recipe)
        tokenizer.save(vocab)
        save_checkpoint(model, weights)
    return model, tokenizer


def _cached_base(weights: Path, vocab: Path) -> tuple[GPT, Tokenizer] | None:
    if not (weights.is_file() and vocab.is_file()):
        return None
    try:
        model, tokenizer = load_checkpoint(weights), Tokenizer.load(vocab)
    except ValueError:
        return None  # a damaged cache file: rebuilt rather than trusted
    model.eval()
    return model, tokenizer


def corpus_split(tokenizer: Tokenizer, recipe: Recipe = Recipe()) -> tuple[np.ndarray, np.ndarray]:
    """The base model's corpus as tokens: ``(train, held_out)``, the held-out part the last 10%.
    Each story ends with ``<|endoftext|>`` (the first special token), as documents do in GPT-2's
    training data, so the model learns when a text is over — which module 9's answers rely on."""
    end = recipe.special_tokens[0]
    text = data.corpus(recipe.corpus_chars, seed=recipe.corpus_seed).replace("\n", end)
    return data.train_val_split(np.array(tokenizer.encode(text, allowed_special={end})), 0.1)


def held_out_ids(tokenizer: Tokenizer, recipe: Recipe = Recipe()) -> np.ndarray:
    """The validation tokens of the base model's corpus (never trained on)."""
    return corpus_split(tokenizer, recipe)[1]


# Module 10's speculative-decoding pair. The target trains at a third of the base recipe's learning
# rate: at 3e-3 this deeper model's training is chaotic (on two CPU code paths its weights ended
# 0.2 apart and its greedy texts differed), at 1e-3 the two agree to 2e-12.
SPECULATIVE_TARGET = Recipe(n_layer=6, n_embd=128, lr=1e-3)
SPECULATIVE_DRAFT = Recipe(n_layer=1, n_embd=32)
