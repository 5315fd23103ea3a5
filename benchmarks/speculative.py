"""Module 10 on the CPU: speculative decoding speed, and sparse-autoencoder training throughput.

- Speculative decoding: the 6-block, width-128 target and the 1-block, width-32 draft (both from
  ``pretrained.base_model`` recipes, same tokenizer), greedy, 48 new tokens after each of 20
  held-out prompts: acceptance, tokens per target forward against the formula, tokens per
  second against the target decoding alone — after checking that the outputs are identical.
- SAE: training steps per second and activations per second for a 512-feature SAE on 64-wide
  residual vectors.

    python benchmarks/speculative.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import speculative  # noqa: E402
from posttrainllm.evals import greedy_continuation  # noqa: E402
from posttrainllm.model import GPT, GPTConfig  # noqa: E402
from posttrainllm.pretrained import SPECULATIVE_DRAFT, SPECULATIVE_TARGET, base_model, corpus_split  # noqa: E402
from posttrainllm.sae import SparseAutoencoder, train_sae  # noqa: E402


def models(quick: bool):
    if quick:  # untrained stand-ins: the code path, not the numbers
        target = GPT(GPTConfig(vocab_size=64, block_size=64, n_layer=3, n_head=2, n_embd=32)).eval()
        draft = GPT(GPTConfig(vocab_size=64, block_size=64, n_layer=1, n_head=1, n_embd=8, seed=1)).eval()
        return target, draft, np.random.default_rng(0).integers(0, 64, 5000)
    target, tok = base_model(SPECULATIVE_TARGET)
    draft, _ = base_model(SPECULATIVE_DRAFT)
    return target, draft, corpus_split(tok)[1]


def speculative_table(args) -> None:
    target, draft, ids = models(args.quick)
    n_prompts, new = (3, 12) if args.quick else (20, 48)
    prompts = [list(ids[i * 97 : i * 97 + 12]) for i in range(n_prompts)]
    start = time.perf_counter()
    reference = [greedy_continuation(target, p, new) for p in prompts]
    alone = time.perf_counter() - start
    rows = [["target alone", "-", "1.00", "-", f"{n_prompts * new / alone:,.0f}", "1.00x", "yes"]]
    for k in (1, 2, 3, 4, 6, 8):
        start = time.perf_counter()
        runs = [speculative.speculative_generate(target, draft, p, new, k=k) for p in prompts]
        seconds = time.perf_counter() - start
        alpha = float(np.mean([r.acceptance for r in runs]))
        per_forward = sum(len(r.tokens) for r in runs) / sum(r.target_forwards for r in runs)
        same = all(r.tokens == w for r, w in zip(runs, reference, strict=True))
        rows.append([f"k = {k}", f"{alpha:.2f}", f"{per_forward:.2f}",
                     f"{speculative.expected_tokens_per_forward(alpha, k):.2f}", f"{n_prompts * new / seconds:,.0f}",
                     f"{alone / seconds:.2f}x", "yes" if same else "NO"])
    write_result(
        "speculative_decoding",
        f"Greedy speculative decoding on the CPU: target {target.n_params():,} parameters, draft "
        f"{draft.n_params():,} ({target.n_params() / draft.n_params():.0f}x fewer)",
        ["draft tokens", "acceptance", "tokens / target forward", "formula", "tokens / s", "speedup",
         "same output"],
        rows,
        "The target goal was at least 1.5x the target's own tokens/s with identical greedy output and a draft at least "
        "4x smaller. The formula is Leviathan et al.'s (1 - a^(k+1)) / (1 - a) at the measured acceptance a.",
        args.out,
    )


def sae_table(args) -> None:
    acts = torch.randn(20_000, 64)
    rows = []
    for features in (256, 512, 1024):
        auto = SparseAutoencoder(64, features)
        steps = 20 if args.quick else 300
        start = time.perf_counter()
        train_sae(auto, acts, steps=steps, l1=1.0, batch_size=1024)
        seconds = time.perf_counter() - start
        rows.append([features, f"{steps / seconds:,.0f}", f"{steps * 1024 / seconds:,.0f}"])
    write_result(
        "sae_throughput",
        f"Sparse autoencoder training on the CPU ({torch.get_num_threads()} threads), 64-wide inputs, batch 1024",
        ["features", "steps / s", "activations / s"],
        rows,
        "Adam, L1 weighted by decoder norms; the module 10 notebook trains 1,500 steps of the 512-feature SAE.",
        args.out,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="untrained small models, few tokens (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    speculative_table(args)
    sae_table(args)


if __name__ == "__main__":
    main()
