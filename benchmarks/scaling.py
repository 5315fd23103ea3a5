"""Weak scaling of the torchrun trainer (``posttrainllm.pretrain``): DDP and FSDP2 on 1, 2, 4, ... processes.

    python benchmarks/scaling.py                               # CPU: tiny config, 1 and 2 gloo processes
    python benchmarks/scaling.py --config gpt2-small --processes 1,2,4,8    # GPUs: NCCL, one per process

Every process trains the same ``micro_batch`` rows per forward, so the global batch grows with
the process count (weak scaling). A run's rate is the median over its steps, after the first
few, of the tokens per second rank 0 logs; each (mode, processes) pair is run ``--rounds``
times in turn and the median kept. Scaling efficiency is ``tokens/s(N) / (N * tokens/s(1))``:
1.0 when adding processes costs nothing, lower by what the gradient all-reduce (DDP) or the
weight all-gathers and gradient reduce-scatters (FSDP2) cost. On a GPU the table also gives MFU
(see ``pretrain_gpu.py`` for how it is counted).

On the CPU each process has one thread and one core: two processes on two cores is as far as a
two-core machine can honestly go.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, gpt_flops_per_token, peak_bf16, result_suffix, write_result  # noqa: E402

from posttrainllm import pretrain  # noqa: E402
from posttrainllm.model import GPT  # noqa: E402

SKIP = 3  # steps left out of the median: the first pay for allocation, compilation and warm caches


def rate(out: Path) -> float:
    """Median tokens/s over a run's logged steps after the first ``SKIP``."""
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in records[SKIP:])


def measure(config: str, mode: str, processes: int, steps: int, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        # stopping at the last step skips the final save: a save is not a training step
        pretrain.launch(out, [f"parallel={mode}", f"steps={steps}", f"stop_after={steps}", *extra],
                        processes=processes, config=config, torchrun=True)  # N = 1 too: the same wrapper
        return rate(Path(out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--processes", default="", help="comma-separated counts (default: 1,2 on the CPU; "
                        "1,2,4,8 up to the GPU count)")
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default 30; --quick 6)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="few steps, one round: a smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tag", help="appended to a GPU table's name (default: none on an H200, else the GPU's "
                        "model, e.g. h100)")
    parser.add_argument("overrides", nargs="*", help="trainer settings for every run, e.g. micro_batch=8")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count()
    gpu = torch.cuda.get_device_name() if gpus else ""
    counts = [int(n) for n in args.processes.split(",")] if args.processes else \
        [n for n in (1, 2, 4, 8) if n <= gpus] if gpus else [1, 2]
    steps = args.steps or (SKIP + 3 if args.quick else 30)
    rounds = 1 if args.quick else args.rounds
    settings = pretrain.load_config(args.config, args.overrides)
    flops = gpt_flops_per_token(GPT(settings.model).n_params(), settings.model)
    peak = peak_bf16(gpu) if gpus else None
    measured: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for mode in ("ddp", "fsdp"):
            for n in counts:
                measured.setdefault((mode, n), []).append(measure(args.config, mode, n, steps, args.overrides))
    rows = []
    for (mode, n), rates in measured.items():
        tokens = statistics.median(rates)
        single = statistics.median(measured[mode, 1]) if (mode, 1) in measured else None
        efficiency = f"{tokens / (n * single):.2f}" if single else "n/a"
        mfu = f"{100 * tokens * flops / (n * peak):.1f}%" if peak else "n/a"
        rows.append([mode.upper() if mode == "ddp" else "FSDP2", n, f"{tokens:,.0f}", efficiency, mfu])
    backend = "NCCL" if gpus else "gloo"
    where = f"{gpus} x {gpu}" if gpus else f"CPU, {os.cpu_count()} cores, one thread a process"
    nccl = f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if gpus else ""
    notes = (f"{where}; torch {torch.__version__}{nccl}; {datetime.date.today().isoformat()}. Config "
             f"{args.config!r} ({settings.model.n_layer} layers, width {settings.model.n_embd}, context "
             f"{settings.model.block_size}), {settings.micro_batch} x {settings.grad_accum} rows a step per process, "
             f"{settings.precision}{' ' + ' '.join(args.overrides) if args.overrides else ''}; {backend}. "
             f"Median tokens/s of steps {SKIP + 1}-{steps}, median of {rounds} runs. "
             "Efficiency: tokens/s(N) / (N x tokens/s(1)).")
    name = f"scaling_gpu{result_suffix(args.tag, gpu)}" if gpus else "scaling_cpu"
    write_result(name, f"Weak scaling of the torchrun trainer, DDP and FSDP2 ({backend})",
                 ["parallel", "processes", "tokens/s", "scaling efficiency", "MFU"], rows, notes, args.out)


if __name__ == "__main__":
    main()
