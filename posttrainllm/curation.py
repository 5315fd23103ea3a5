"""Module 9's fine-tuning set with planted faults, the curation pipeline that removes them, and the
SFT model trained at each stage (the post-training data chapter, ``book/post-training-data.md``).

The planted set is the 2,000 training questions of :func:`posttrainllm.tuned.sft_model` plus
three faults that real instruction data has:

- **junk**: 400 more questions whose answers are machine noise (symbols, digits, a word
  repeated, nothing);
- **duplicates**: 20 of the questions copied 30 times each (600 rows), as scraped data repeats
  popular items;
- **leaked**: the first 100 of the 300 test questions, with their answers, 5 copies of each
  (a benchmark that is on the web is copied onto many pages).

Each stage of :data:`STAGES` removes one fault: exact deduplication, the quality rules, then
13-gram decontamination against the test set. :func:`stage_model` fine-tunes module 9's LoRA
r=4 model on a stage's data, cached like every other model.
"""

from __future__ import annotations

import random
from pathlib import Path

from posttrainllm import contamination, dedup, quality, sft, tuned
from posttrainllm.pretrained import Recipe, base_model
from posttrainllm.sft import Example

STAGES = ("raw", "deduplicated", "quality-filtered", "decontaminated")
LEAKED, COPIES = 100, 5  # the first LEAKED test questions are planted COPIES times each
TEST_SIZE = 300


def test_set() -> list[Example]:
    return sft.examples("questions", TEST_SIZE, split="test")


def _junk(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return "".join(rng.choice("#@%&*~^|<>") for _ in range(rng.randint(3, 6)))
    if kind == 1:
        return " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(1, 3)))
    if kind == 2:
        return " ".join([rng.choice(["the", "a", "it", "and"])] * rng.randint(3, 5))
    return ""


def planted() -> tuple[list[Example], list[str]]:
    """The planted training set and, row by row, what each row is: clean, junk, duplicate or leaked."""
    rng = random.Random(0)
    clean = sft.examples("questions", 2000)
    junk = [Example(e.prompt, _junk(rng), e.task) for e in sft.examples("questions", 400, seed=7)]
    duplicates = [e for e in clean[:20] for _ in range(30)]
    leaked = [e for e in test_set()[:LEAKED] for _ in range(COPIES)]
    rows = [(e, "clean") for e in clean] + [(e, "junk") for e in junk] + [(e, "duplicate") for e in duplicates] \
        + [(e, "leaked") for e in leaked]
    rng.shuffle(rows)
    return [e for e, _ in rows], [kind for _, kind in rows]


def _text(e: Example) -> str:
    return f"{e.prompt} {e.response}"


def stages() -> dict[str, list[int]]:
    """For each stage, the indices into :func:`planted`'s rows that it keeps (cumulative)."""
    rows, _ = planted()
    kept = {"raw": list(range(len(rows)))}
    repeats = set(dedup.exact_duplicates([_text(e) for e in rows]))
    kept["deduplicated"] = [i for i in kept["raw"] if i not in repeats]
    kept["quality-filtered"] = [i for i in kept["deduplicated"] if quality.passes(rows[i].response)]
    tests = [_text(e) for e in test_set()]
    candidates = kept["quality-filtered"]
    flagged = contamination.dirty([_text(rows[i]) for i in candidates], tests, n=13)
    kept["decontaminated"] = [i for i, bad in zip(candidates, flagged, strict=True) if not bad]
    return kept


def stage_model(stage: str, steps: int = 500, cache_dir: Path | None = None):
    """Module 9's LoRA r=4 SFT (same steps, rate and seed, the default base recipe) on one stage's
    rows; cached. Returns ``(model, history)``."""

    recipe = Recipe()
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: choose one of {STAGES}")
    rows, _ = planted()
    train_set = [rows[i] for i in stages()[stage]]

    def fit(model):
        tokenizer = base_model(recipe, cache_dir)[1]
        return {"loss": sft.train_sft(model, tokenizer, train_set, steps=steps, lr=3e-3)}

    return tuned._tuned(f"curation-{stage}-r4-{steps}-{recipe.key}", tuned._sft_skeleton(4, recipe, cache_dir),
                        fit, cache_dir)
