"""Module 10's policy-gradient ladder: what each piece of GRPO does, measured (issue 54).

From the book's GRPO start (module 9's LoRA r=4 model, rounded by ``rl.reproducible_start``) and
with its composite reward, two measurements:

- **Gradient noise.** 128 batches of 8 questions x 8 sampled answers, each turned into a policy
  gradient with the reward as it is (REINFORCE), minus the group's mean (a baseline), and also
  divided by the group's std (GRPO's advantage): the same answers for all three. The noise is the
  mean squared distance of one estimate from the mean of all 128, over the squared norm of that
  mean.
- **The climb.** Each rung of ``rl.LADDER`` trains 100 steps at the book's settings (lr 2e-3, 8
  prompts x 8 answers, temperature 1), from sampling seeds 0 and 1: the reward, the sampled
  answers' true correctness, the KL to the start and the policy's entropy, per step.

Every run is its own process with one PyTorch thread, ``--jobs`` at a time.

    python benchmarks/pg_ladder.py [--quick] [--jobs 2]
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

from posttrainllm import evals, rl, sft  # noqa: E402
from posttrainllm.pretrained import base_model, float64  # noqa: E402
from posttrainllm.tuned import sft_model  # noqa: E402

SEEDS = (0, 1)
NOISE = {"reward as it is (REINFORCE)": rl.raw_rewards, "minus the group's mean": rl.centred,
         "and over the group's std (GRPO)": rl.group_advantages}


def _start():
    tok = base_model()[1]
    return tok, rl.reproducible_start(sft_model(4)[0]), sft.examples("questions", 500, seed=4)


def _correct(example, completion) -> float:
    return evals.correctness(completion, example.response)


@float64()
def climb(rung: str, seed: int, steps: int) -> dict:
    """One rung's run: its history per step."""
    torch.set_num_threads(1)
    tok, start, pool = _start()
    history = rl.train_grpo(copy.deepcopy(start), start, tok, pool, rl.composite, steps=steps, lr=2e-3, seed=seed,
                            track=_correct, **rl.LADDER[rung])
    return {key: history[key] for key in ("reward", "tracked", "kl", "entropy")}


@float64()
def noise(draws: int, resamples: int = 2000) -> dict:
    """Per advantage: its gradient noise, the norm of its mean gradient, and its noise over
    REINFORCE's with a 95% paired bootstrap interval (the same batches resampled for both)."""
    torch.set_num_threads(1)
    tok, start, pool = _start()
    found = rl.policy_gradients(start, tok, pool, rl.composite, NOISE, draws)
    first = found[next(iter(NOISE))]
    picks = np.random.default_rng(0).integers(0, draws, (resamples, draws))
    picks = [pick for pick in picks if len(set(pick)) > 1]  # one batch drawn every time has no spread
    out = {}
    for name, g in found.items():
        ratios = [rl.gradient_noise(g[i]) / rl.gradient_noise(first[i]) for i in picks]
        out[name] = (rl.gradient_noise(g), float(g.mean(0).norm()), rl.gradient_noise(g) / rl.gradient_noise(first),
                     *np.percentile(ratios, [2.5, 97.5]))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 steps, 4 draws, one seed (a smoke test)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    steps, draws, seeds = (3, 4, SEEDS[:1]) if args.quick else (100, 128, SEEDS)
    runs = [(rung, seed) for rung in rl.LADDER for seed in seeds]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        measured = pool.submit(noise, draws)
        histories = list(pool.map(climb, *zip(*runs, strict=True), [steps] * len(runs)))
        measured = measured.result()
    write_result(
        "pg_ladder_noise",
        f"How noisy one policy-gradient estimate is, by advantage ({draws} batches of 8 questions x 8 answers)",
        ["advantage", "noise: mean ‖g − ḡ‖² / ‖ḡ‖²", "‖ḡ‖ (ḡ: the mean of the estimates)",
         "noise / REINFORCE's [95% CI]"],
        [[name, f"{n:.1f}", f"{norm:.3g}", f"{ratio:.2f} [{low:.2f}, {high:.2f}]"]
         for name, (n, norm, ratio, low, high) in measured.items()],
        "The book's GRPO start and composite reward; each batch's answers serve all three advantages. The interval "
        "resamples the batches 2,000 times, the same ones for both advantages.",
        args.out,
    )
    window = min(20, steps)
    rows = []
    for rung in rl.LADDER:
        mine = [h for (r, _), h in zip(runs, histories, strict=True) if r == rung]
        last = {key: [np.mean(h[key][-window:]) for h in mine] for key in ("reward", "tracked", "kl", "entropy")}
        first = [np.mean(h["reward"][:window]) for h in mine]
        rows.append([rung, " / ".join(f"{a:.2f} -> {b:.2f}" for a, b in zip(first, last["reward"], strict=True)),
                     " / ".join(f"{v:.2f}" for v in last["tracked"]), " / ".join(f"{v:.3f}" for v in last["kl"]),
                     " / ".join(f"{v:.2f}" for v in last["entropy"])])
    write_result(
        "pg_ladder",
        f"Each rung of the ladder to GRPO, {steps} steps from the same start (seeds {' / '.join(map(str, seeds))})",
        ["rung", f"reward, first -> last {window} steps", f"sampled correctness, last {window}",
         f"KL to the start, last {window}", f"entropy (nats), last {window}"],
        rows,
        "Composite reward, lr 2e-3, 8 prompts x 8 answers a step, temperature 1; one PyTorch thread per run in "
        "float64. Each rung adds one piece to the rung above it (rl.LADDER).",
        args.out,
        data={"steps": steps, "seeds": list(seeds),
              "runs": [{"rung": rung, "seed": seed, **h} for (rung, seed), h in zip(runs, histories, strict=True)]},
    )


if __name__ == "__main__":
    main()
