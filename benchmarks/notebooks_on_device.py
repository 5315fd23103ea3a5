"""Every notebook executed with the library's work on a GPU: proof that the notebooks run there.

    python benchmarks/notebooks_on_device.py                       # on a CUDA machine: results/notebooks_gpu.json
    python benchmarks/notebooks_on_device.py --quick --device cpu  # anywhere: module 1 alone, a smoke test

Each notebook runs top to bottom in a fresh kernel (``nbclient``) with ``POSTTRAINLLM_DEVICE`` set,
so ``train``, ``evaluate``, ``generate``, ``greedy`` and ``speculative_generate`` borrow the GPU;
cells that call a model directly stay on the CPU. Outputs are not compared with the stored ones
(a GPU's sums differ in their last digits): a notebook passes when every cell runs, its asserts
included. After the last cell, the kernel reports its peak CUDA memory, which shows that the
GPU did the work. The shared models (``posttrainllm models``) are trained first, on the device,
in a fresh cache, and timed; ``--cache DIR`` starts from a copy of an existing cache instead.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, nvidia_driver, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PEAK = "import json, torch; print(json.dumps(torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0))"


def execute(path: Path, timeout: int) -> dict:
    """Run one notebook in a fresh kernel; ``error`` names the first cell that failed."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PEAK))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    began = time.perf_counter()
    error = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = next(i for i, cell in enumerate(nb.cells)
                      if any(o.get("output_type") == "error" for o in cell.get("outputs", [])))
        error = f"cell {failed}: {exc.ename}: {exc.evalue}"[:300]
    except Exception as exc:  # a timeout or a dead kernel: still one row of the table, not a crash of the run
        error = f"{type(exc).__name__}: {exc}"[:300]
    seconds = time.perf_counter() - began
    peak = 0
    if error is None:
        peak = json.loads("".join(o.get("text", "") for o in nb.cells[-1].outputs))
    return {"notebook": path.name, "error": error, "seconds": seconds, "peak_bytes": peak}


def train_shared_models(env: dict) -> str:
    """``posttrainllm models`` on the device, in the fresh cache; its own report of each model's time."""
    done = subprocess.run([sys.executable, "-m", "posttrainllm", "models"], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"posttrainllm models failed:\n{done.stderr[-3000:]}")
    return done.stdout


def drift_against_cpu(device: str, steps: int = 20) -> float:
    """The largest relative difference between ``train``'s float64 losses on ``device`` and on the
    CPU, same weights and batches; also checks that the model and the optimizer's moments come back
    to the CPU afterwards (``device.borrowed``)."""
    import numpy as np
    import torch

    from posttrainllm import data, optim
    from posttrainllm import train as training
    from posttrainllm.model import GPT, GPTConfig

    ids = np.frombuffer(data.corpus(20_000).encode(), dtype=np.uint8).astype(np.int64)  # bytes as tokens
    losses = {}
    for where in ("cpu", device):
        model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)).double()
        optimizer = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0)
        losses[where] = np.array(training.train(model, ids, steps=steps, batch_size=8, optimizer=optimizer,
                                                device=where)["train"])
        moments = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
        if any(t.device.type != "cpu" for t in [*model.parameters(), *moments]):
            raise AssertionError(f"train(device={where!r}) left the model or its optimizer state off the CPU")
    return float(np.max(np.abs(losses[device] - losses["cpu"]) / np.abs(losses["cpu"])))


def gpu_facts() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"no GPU, torch {torch.__version__}"
    return f"{torch.cuda.get_device_name()}, driver {nvidia_driver()}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="what POSTTRAINLLM_DEVICE is set to (default cuda)")
    parser.add_argument("--quick", action="store_true", help="module 1 alone: a smoke test of this script")
    parser.add_argument("--parallel", type=int, default=4, help="notebooks run at once, each in its own kernel")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one cell may take")
    parser.add_argument("--only", nargs="+", default=[], help="notebooks whose names start so (e.g. 07 08)")
    parser.add_argument("--cache", type=Path, help="start from a copy of this model cache instead of training")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))[: 1 if args.quick else None]
    notebooks = [p for p in notebooks if not args.only or p.name.startswith(tuple(args.only))]
    cache = tempfile.mkdtemp(prefix="posttrainllm-cache-")
    if args.cache:
        shutil.copytree(args.cache, cache, dirs_exist_ok=True)
    env = {**os.environ, "POSTTRAINLLM_DEVICE": args.device, "POSTTRAINLLM_CACHE": cache}
    os.environ.update(env)  # the kernels inherit it
    drift = drift_against_cpu(args.device)
    began = time.perf_counter()
    report = "" if args.quick or args.cache else train_shared_models(env)
    models_seconds = time.perf_counter() - began
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        results = list(pool.map(lambda p: execute(p, args.timeout), notebooks))
    rows = [[r["notebook"], "ran" if r["error"] is None else f"failed at {r['error']}", f"{r['seconds']:.0f}",
             f"{r['peak_bytes'] / 2**20:,.0f}"] for r in results]
    name = "notebooks_gpu" if args.device.startswith("cuda") else f"notebooks_{args.device}"
    earlier = args.out / f"{name}.json"
    if args.only and earlier.is_file():  # a re-run of some notebooks replaces their rows of the last table
        previous = json.loads(earlier.read_text())
        rerun = {r[0] for r in rows}
        rows = sorted([r for r in previous["rows"] if r[0] not in rerun] + rows)
    notes = (f"{gpu_facts()}, {datetime.date.today().isoformat()}. POSTTRAINLLM_DEVICE={args.device}; "
             f"{args.parallel} notebooks at a time, each in a fresh kernel, so the times overlap. "
             f"train() on the device against the CPU, float64, 20 steps: largest relative loss difference {drift:.1e}; "
             "the model and its AdamW moments came back to the CPU. "
             + ("" if args.quick else "The shared models came from a cache trained on a CPU." if args.cache else
                f"The shared models were trained first on the device in a fresh cache: {models_seconds:.0f} s in all."))
    if args.only and earlier.is_file():
        notes = f"{previous['notes']} Re-run of {', '.join(sorted(rerun))} (--only): {notes}"
    write_result(name, f"Every notebook with POSTTRAINLLM_DEVICE={args.device}",
                 ["notebook", "result", "seconds", "peak device memory (MiB)"], rows, notes, out_dir=args.out)
    print(report)
    if any(r["error"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
