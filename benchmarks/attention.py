"""Attention on the CPU: numpy FlashAttention-2 vs naive numpy attention, and GPT throughput.

- For N = 512 ... 4096 (one head, d = 64, fp32, causal): time (best of several runs) and the
  peak memory each allocates beyond its inputs and output (``tracemalloc``). Both are checked
  to give the same output first.
- Training throughput of the oracle GPT (tokens per second) with naive and with FA2 attention:
  the baseline the WASM trainer is compared with later.

    python benchmarks/attention.py [--quick]
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

from posttrainllm import attention as att  # noqa: E402
from posttrainllm.measure import extra_peak_bytes, measure_seconds  # noqa: E402
from posttrainllm.model import GPT, GPTConfig  # noqa: E402
from posttrainllm.train import train  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    lengths, repeats, steps = ([128, 256], 1, 3) if args.quick else ([512, 1024, 2048, 4096], 3, 60)
    rng = np.random.default_rng(0)
    rows = []
    for n in lengths:
        q, k, v = (rng.standard_normal((1, n, 64)).astype(np.float32) for _ in range(3))
        naive = lambda q=q, k=k, v=v: att.attention(q, k, v, causal=True)  # noqa: E731
        flash = lambda q=q, k=k, v=v: att.flash_attention_forward(q, k, v, True, 128, 128)  # noqa: E731
        np.testing.assert_allclose(flash()[0], naive(), atol=1e-5)
        t_naive, t_flash = measure_seconds(naive, repeats), measure_seconds(flash, repeats)
        m_naive, m_flash = extra_peak_bytes(naive), extra_peak_bytes(flash)
        rows.append([n, f"{t_naive * 1e3:.1f}", f"{t_flash * 1e3:.1f}", f"{t_flash / t_naive:.2f}x",
                     f"{m_naive / 2**20:.2f}", f"{m_flash / 2**20:.2f}", f"{m_flash / m_naive:.1%}"])
    write_result(
        "attention_memory",
        "Causal attention forward, one head, d = 64, fp32: naive numpy vs numpy FlashAttention-2 (tiles 128)",
        ["N", "naive ms", "FA2 ms", "FA2 / naive time", "naive extra MiB", "FA2 extra MiB", "FA2 / naive memory"],
        rows,
        "Extra memory: peak allocation beyond inputs and output. The targets at N = 4096 were at most 10% of "
        "naive's memory and at most 2x its time.",
        args.out,
    )

    torch.manual_seed(0)
    data = np.random.default_rng(0).integers(0, 512, 50_000)
    rows = []
    for kind in ("naive", "flash"):
        config = GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64, attention=kind)
        model = GPT(config)
        start = time.perf_counter()
        train(model, data, steps=steps, batch_size=16)
        seconds = time.perf_counter() - start
        rows.append([kind, f"{model.n_params():,}", f"{steps * 16 * 64 / seconds:,.0f}"])
    write_result(
        "gpt_throughput",
        f"Oracle GPT training throughput on the CPU ({torch.get_num_threads()} threads, batch 16 x 64 tokens)",
        ["attention", "parameters", "tokens / s"],
        rows,
        "FA2 here is the numpy implementation called from PyTorch: it shows the algorithm, not a fast kernel.",
        args.out,
    )


if __name__ == "__main__":
    main()
