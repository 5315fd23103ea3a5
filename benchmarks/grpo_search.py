"""Module 10's honest reward: does any GRPO setting raise held-out exact match? (issue 54)

Each row trains GRPO from the book's start (module 9's LoRA r=4 model, rounded by
``rl.reproducible_start``) on ``tuned.grpo_model``'s 500 training questions, changing one or two
settings from the book's run (composite reward, lr 2e-3, 8 prompts x 8 answers, temperature 1,
KL weight 0.04, 100 steps), and scores the greedy answers to the 400 held-out questions before
and after, with McNemar's paired test. A first table gives the start's headroom: how often one
sampled answer is right, and how often at least one of eight is (pass@8), against greedy.

Every configuration runs in its own process with one PyTorch thread, ``--jobs`` at a time.

    python benchmarks/grpo_search.py [--quick] [--jobs 2]
"""

from __future__ import annotations

import argparse
import copy
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import comparison, evals, rl, sft  # noqa: E402
from posttrainllm.pretrained import base_model, float64  # noqa: E402
from posttrainllm.tuned import sft_model  # noqa: E402

BOOK = {"reward": "composite", "lr": 2e-3, "prompts": 8, "group": 8, "temperature": 1.0, "kl": 0.04, "steps": 100,
        "seed": 0}
CONFIGS = {  # the book's run, then each change tried
    "the book's run": {},
    "lr 5e-4": {"lr": 5e-4},
    "lr 2e-4": {"lr": 2e-4},
    "lr 5e-4, sampling seed 1": {"lr": 5e-4, "seed": 1},
    "lr 5e-4, correctness alone": {"lr": 5e-4, "reward": "correct"},
    "lr 5e-4, temperature 0.7": {"lr": 5e-4, "temperature": 0.7},
    "lr 5e-4, 16 prompts a step": {"lr": 5e-4, "prompts": 16},
    "lr 1e-3, 16 prompts a step": {"lr": 1e-3, "prompts": 16},
    "lr 5e-4, 300 steps": {"lr": 5e-4, "steps": 300},
    "300 steps": {"steps": 300},
}
REWARDS = {"composite": rl.composite, "correct": lambda e, c: evals.correctness(c, e.response)}


def _questions(quick: bool):
    return sft.examples("questions", 500, seed=4), sft.examples("questions", 16 if quick else 400, split="test")


@float64()
def run(name: str, quick: bool) -> list:
    """One row: train from the book's start with ``CONFIGS[name]`` and score it."""
    torch.set_num_threads(1)
    cfg = BOOK | CONFIGS[name] | ({"steps": 2} if quick else {})
    tok = base_model()[1]
    start = rl.reproducible_start(sft_model(4)[0])
    policy = copy.deepcopy(start)
    pool, test = _questions(quick)
    h = rl.train_grpo(policy, start, tok, pool, REWARDS[cfg["reward"]], steps=cfg["steps"], lr=cfg["lr"],
                      kl_coef=cfg["kl"], temperature=cfg["temperature"], prompts_per_step=cfg["prompts"],
                      group_size=cfg["group"], seed=cfg["seed"], track=lambda e, c: evals.correctness(c, e.response))
    before, after = sft.right_answers(start, tok, test), sft.right_answers(policy, tok, test)
    ends = slice(0, min(10, cfg["steps"])), slice(-min(10, cfg["steps"]), None)
    moved = f"+{(after & ~before).sum()} / -{(before & ~after).sum()}"
    return [name, f"{before.mean():.1%} -> {after.mean():.1%}", moved, f"{comparison.mcnemar_p(after, before):.2f}",
            " -> ".join(f"{np.mean(h['tracked'][s]):.2f}" for s in ends), f"{np.mean(h['kl'][ends[1]]):.3f}"]


@float64()
def headroom(quick: bool) -> list:
    """The start's greedy exact match, one sampled answer's, and pass@8, on the held-out questions."""
    torch.set_num_threads(1)
    tok = base_model()[1]
    start = rl.reproducible_start(sft_model(4)[0])
    _, test = _questions(quick)
    greedy = sft.right_answers(start, tok, test)
    generator = torch.Generator().manual_seed(0)
    right = np.array([[evals.correctness(rl.completion_text(tok, c), e.response) for c in
                       rl.sample_group(start, tok, e.prompt, 8, 12, 1.0, generator)] for e in test])
    return [f"{greedy.mean():.1%}", f"{right.mean():.1%}", f"{right.any(1).mean():.1%}",
            f"{(right.any(1) & ~greedy).mean():.1%}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two settings, two steps, 16 questions (a smoke test)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = list(CONFIGS)[:2] if args.quick else list(CONFIGS)
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        room = pool.submit(headroom, args.quick)
        rows = list(pool.map(run, names, [args.quick] * len(names)))
        room = room.result()
    questions = 16 if args.quick else 400
    write_result(
        "grpo_headroom",
        f"The GRPO start (module 9's LoRA r=4, rounded) on {questions} held-out questions: greedy against sampled",
        ["greedy exact match", "one sample at T = 1", "pass@8 (any of 8 samples)", "pass@8 where greedy is wrong"],
        [room],
        "Eight answers sampled at temperature 1 per question, up to 12 tokens, as GRPO samples them.",
        args.out,
    )
    write_result(
        "grpo_search",
        f"GRPO from the same start: greedy held-out exact match before and after, {questions} questions",
        ["setting", "exact match", "gained / lost", "McNemar p", "sampled correctness, first -> last 10 steps",
         "KL, last 10 steps"],
        rows,
        "Each row changes the named settings of the book's run (composite reward, lr 2e-3, 8 prompts x 8 answers, "
        "temperature 1, KL weight 0.04, 100 steps); one PyTorch thread per run in float64, so its figures can differ "
        "from the book's two-thread run of the same setting (GRPO samples its own data: a last-bit difference "
        "changes a sample some tens of steps in).",
        args.out,
    )


if __name__ == "__main__":
    main()
