"""Module 9's fine-tuned models, cached: the base model (:mod:`posttrainllm.pretrained`) tuned on
questions with every weight or with LoRA adapters at each rank (:func:`sft_model`), then with
DPO (:func:`dpo_model`); and module 10's GRPO policies (:func:`grpo_model`).

Each is trained once, in float64, and read from the cache afterwards, so module 10 can score every
one of them without training them again — and without depending on module 9 having run first.
A damaged cache file is rebuilt rather than trusted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from posttrainllm import data
from posttrainllm.model import GPT
from posttrainllm.pretrained import Recipe, base_model, float64
from posttrainllm.train import load_file, save_file

TUNE_VERSION = 2  # bump whenever sft_model or dpo_model changes what the same arguments produce
GRPO_VERSION = 2  # bump whenever grpo_model's run or the history it keeps changes (2: entropy and length)
TUNED_FORMAT = "posttrainllm-tuned-1"
TARGETS = ("attn.qkv", "attn.proj", "mlp.up", "mlp.proj")  # module 9 adapts every projection in every block


@float64()
def _tuned(name: str, skeleton: Callable[[], GPT], fit: Callable[[GPT], dict], cache_dir: Path | None):
    """``skeleton()`` makes the untrained model (base weights, adapters injected); ``fit`` trains it in
    place and returns its history. Both are cached together; a damaged file is rebuilt."""
    cache = Path(cache_dir or data.default_cache_dir())
    path = cache / f"tuned-{name}-v{TUNE_VERSION}.pt"
    model = skeleton()
    if (history := _cached(model, path)) is not None:
        return model, history
    with data.training_into(cache, path):
        if (history := _cached(model, path)) is not None:
            return model, history  # another process trained it while this one waited
        history = fit(model)
        model.eval()
        save_file({"format": TUNED_FORMAT, "state_dict": model.state_dict(), "history": history}, path)
    return model, history


def _cached(model: GPT, path: Path) -> dict | None:
    """Load ``path`` into ``model`` and return its history; None if it is missing or unusable."""
    if not path.is_file():
        return None
    try:
        payload = load_file(path, TUNED_FORMAT, "fine-tuned model", "cache file")
        model.load_state_dict(payload["state_dict"])
    except (ValueError, RuntimeError):  # damaged, or saved from a differently shaped model
        return None
    model.eval()
    return payload["history"]


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
              cache_dir: Path | None = None, questions: int = 600) -> tuple[GPT, dict]:
    """Module 9's DPO model and its history (loss, margin, chosen log-probability per step): the LoRA
    r=4 :func:`sft_model` tuned on pairs from its own wrong answers to ``questions`` fresh training
    questions, with itself as the frozen reference (beta 0.1, lr 3e-4); ``nll_weight`` adds the RPO term."""
    from posttrainllm import preference, sft

    def fit(model: GPT) -> dict:
        reference, tokenizer = sft_model(4, sft_steps, recipe, cache_dir)[0], base_model(recipe, cache_dir)[1]
        model.load_state_dict(reference.state_dict())
        pairs = preference.mistake_pairs(reference, tokenizer, sft.examples("questions", questions, seed=1))
        return preference.train_dpo(model, reference, tokenizer, pairs, steps=steps, lr=3e-4, beta=0.1,
                                    nll_weight=nll_weight)

    asked = "" if questions == 600 else f"-q{questions}"  # the book's 600 keep the cache's existing names
    name = f"dpo-nll{nll_weight:g}-{steps}-sft{sft_steps}{asked}-{recipe.key}"
    return _tuned(name, _sft_skeleton(4, recipe, cache_dir), fit, cache_dir)


def grpo_model(reward: str, steps: int = 100, sft_steps: int = 500, recipe: Recipe = Recipe(),
               cache_dir: Path | None = None) -> tuple[GPT, dict]:
    """Module 10's GRPO policy for ``reward`` (a key of :data:`posttrainllm.rl.REWARDS`) and its
    history (per step: reward, KL, tracked correctness, the policy's token entropy and the answers'
    length; see :func:`rl.train_grpo`): the LoRA r=4 :func:`sft_model` with its
    weights rounded by :func:`rl.reproducible_start`, trained for ``steps`` steps on 500 training
    questions (seed 4) at lr 2e-3 with a KL penalty of 0.04 to that same start, its sampled answers'
    correctness tracked beside the reward."""
    from posttrainllm import evals, rl, sft

    if reward not in rl.REWARDS:
        raise ValueError(f"unknown reward {reward!r}: choose one of {sorted(rl.REWARDS)}")

    def start() -> GPT:
        return rl.reproducible_start(sft_model(4, sft_steps, recipe, cache_dir)[0])

    def fit(model: GPT) -> dict:
        tokenizer = base_model(recipe, cache_dir)[1]
        pool = sft.examples("questions", 500, seed=4)
        return rl.train_grpo(model, start(), tokenizer, pool, rl.REWARDS[reward], steps=steps, lr=2e-3,
                             kl_coef=0.04, track=lambda e, c: evals.correctness(c, e.response))

    name = f"grpo-{rl.REWARDS[reward].__name__}-{steps}-sft{sft_steps}-{recipe.key}-h{GRPO_VERSION}"
    return _tuned(name, start, fit, cache_dir)
