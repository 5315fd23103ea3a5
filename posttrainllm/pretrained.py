"""The pretrained base model that modules 8–10 start from, and module 9's fine-tuned models.

:func:`base_model` trains a tokenizer and a GPT on the built-in corpus with a fixed, seeded
recipe, and caches both under the cache directory in files named by a hash of the recipe. The
first call trains (about a minute on two CPU cores); later calls — from any notebook, in
any order, in a fresh kernel — load the cached files. Files are written atomically; a damaged
cache file is rebuilt rather than trusted.

:func:`sft_model` and :func:`dpo_model` do the same for the models module 9 fine-tunes from it
(full SFT, LoRA at each rank, DPO), so module 10 can score every one of them without training
them again — and without depending on module 9 having run first.

Every model here is trained and stored in float64, whatever the caller's default dtype: in
float32 the last bits of a sum depend on the CPU's vector width and thread count, and training
amplifies them into different printed losses and samples on different machines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from posttrainllm import data
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.tokenizer import Tokenizer
from posttrainllm.train import load_checkpoint, load_file, save_checkpoint, save_file, train

BUILD_VERSION = 3  # bump whenever _build or corpus_split changes what the same recipe produces
TUNE_VERSION = 2  # bump whenever sft_model or dpo_model changes what the same arguments produce
TUNED_FORMAT = "posttrainllm-tuned-1"
TARGETS = ("attn.qkv", "attn.proj", "mlp.up", "mlp.proj")  # module 9 adapts every projection in every block


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
    cache.mkdir(parents=True, exist_ok=True)
    weights, vocab = cache / f"base-{recipe.key}.pt", cache / f"base-{recipe.key}.bpe"
    if weights.is_file() and vocab.is_file():
        try:
            model, tokenizer = load_checkpoint(weights), Tokenizer.load(vocab)
            model.eval()
            return model, tokenizer
        except ValueError:
            pass  # a damaged cache file: rebuild it below rather than trust it
    model, tokenizer = _build(recipe)
    tokenizer.save(vocab)
    save_checkpoint(model, weights)
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


@float64()
def _tuned(name: str, skeleton: Callable[[], GPT], fit: Callable[[GPT], dict], cache_dir: Path | None):
    """``skeleton()`` makes the untrained model (base weights, adapters injected); ``fit`` trains it in
    place and returns its history. Both are cached together; a damaged file is rebuilt."""
    cache = Path(cache_dir or data.default_cache_dir())
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"tuned-{name}-v{TUNE_VERSION}.pt"
    model = skeleton()
    if path.is_file():
        try:
            payload = load_file(path, TUNED_FORMAT, "fine-tuned model", "cache file")
            model.load_state_dict(payload["state_dict"])
            model.eval()
            return model, payload["history"]
        except (ValueError, RuntimeError):  # damaged, or saved from a differently shaped model
            pass
    history = fit(model)
    model.eval()
    save_file({"format": TUNED_FORMAT, "state_dict": model.state_dict(), "history": history}, path)
    return model, history


def _sft_skeleton(rank: int | None, recipe: Recipe, cache_dir: Path | None) -> Callable[[], GPT]:
    from posttrainllm import lora

    def skeleton() -> GPT:
        model = base_model(recipe, cache_dir)[0]
        return lora.inject(model, TARGETS, rank=rank, alpha=2 * rank, name="answers") if rank else model

    return skeleton


def sft_model(rank: int | None = 4, steps: int = 500, recipe: Recipe = Recipe(),
              cache_dir: Path | None = None) -> tuple[GPT, dict]:
    """Module 9's question-answering model and its ``{"loss": [...]}`` history: the base model fine-tuned
    on 2,000 questions for ``steps`` steps — every weight at lr 1e-3 (``rank=None``), or a LoRA adapter
    named ``"answers"`` of rank ``rank`` and alpha ``2 * rank`` on :data:`TARGETS` at lr 3e-3."""
    from posttrainllm import sft

    def fit(model: GPT) -> dict:
        tokenizer = base_model(recipe, cache_dir)[1]
        questions = sft.examples("questions", 2000)
        return {"loss": sft.train_sft(model, tokenizer, questions, steps=steps, lr=3e-3 if rank else 1e-3)}

    name = f"sft-{f'r{rank}' if rank else 'full'}-{steps}-{recipe.key}"
    return _tuned(name, _sft_skeleton(rank, recipe, cache_dir), fit, cache_dir)


def dpo_model(nll_weight: float = 0.0, steps: int = 150, sft_steps: int = 500, recipe: Recipe = Recipe(),
              cache_dir: Path | None = None) -> tuple[GPT, dict]:
    """Module 9's DPO model and its history (loss, margin, chosen log-probability per step): the LoRA
    r=4 :func:`sft_model` tuned on pairs from its own wrong answers to 600 fresh training questions,
    with itself as the frozen reference (beta 0.1, lr 3e-4); ``nll_weight`` adds the RPO term."""
    from posttrainllm import preference, sft

    def fit(model: GPT) -> dict:
        reference, tokenizer = sft_model(4, sft_steps, recipe, cache_dir)[0], base_model(recipe, cache_dir)[1]
        model.load_state_dict(reference.state_dict())
        pairs = preference.mistake_pairs(reference, tokenizer, sft.examples("questions", 600, seed=1))
        return preference.train_dpo(model, reference, tokenizer, pairs, steps=steps, lr=3e-4, beta=0.1,
                                    nll_weight=nll_weight)

    name = f"dpo-nll{nll_weight:g}-{steps}-sft{sft_steps}-{recipe.key}"
    return _tuned(name, _sft_skeleton(4, recipe, cache_dir), fit, cache_dir)


# Module 10's speculative-decoding pair. The target trains at a third of the base recipe's learning
# rate: at 3e-3 this deeper model's training is chaotic (on two CPU code paths its weights ended
# 0.2 apart and its greedy texts differed), at 1e-3 the two agree to 2e-12.
SPECULATIVE_TARGET = Recipe(n_layer=6, n_embd=128, lr=1e-3)
SPECULATIVE_DRAFT = Recipe(n_layer=1, n_embd=32)

# Every cached model a notebook loads: modules 7–10's base model, module 10's speculative-decoding
# target and draft, and module 9's fine-tuned models (which module 10 scores again).
NOTEBOOK_MODELS: dict[str, Callable[[], object]] = {
    "base": lambda: base_model(),
    "speculative target (6 blocks, width 128)": lambda: base_model(SPECULATIVE_TARGET),
    "speculative draft (1 block, width 32)": lambda: base_model(SPECULATIVE_DRAFT),
    **{f"SFT, {f'LoRA r={r}' if r else 'all weights'}": (lambda r=r: sft_model(rank=r))
       for r in (None, 1, 2, 4, 8)},
    **{f"DPO, NLL weight {w:g}": (lambda w=w: dpo_model(nll_weight=w)) for w in (0.0, 1.0)},
}


def build_all(report: Callable[[str, float], None] = lambda name, seconds: None) -> None:
    """Train (or find in the cache) every model in :data:`NOTEBOOK_MODELS`; ``report(name, seconds)``
    after each. Run once before the notebooks so that none of them pays for training on its first run."""
    import time

    for name, build in NOTEBOOK_MODELS.items():
        start = time.perf_counter()
        build()
        report(name, time.perf_counter() - start)
