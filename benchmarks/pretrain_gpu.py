"""The book's GPT at GPT-2 small's shape on one GPU, beside ``transformers``' GPT-2 in the same run.

    python benchmarks/pretrain_gpu.py                         # on a CUDA machine: results/pretrain_gpu.json
    python benchmarks/pretrain_gpu.py --quick --out /tmp/x    # anywhere: a tiny shape, a few steps, eager
    python benchmarks/pretrain_gpu.py --part trainer          # the torchrun trainer alone
                                                              # (results/pretrain_torchrun_gpu.json)
    python benchmarks/pretrain_gpu.py --part drift --tag h100 # the fused head's drift from fp32 alone
    python benchmarks/pretrain_gpu.py --part models --batch 32 --rounds 2 --profile --tag h100
                                                              # another GPU's tables, beside the H200's
    python benchmarks/pretrain_gpu.py --part models --batch 64 --rounds 2 --profile --tune --tag h100_tuned
                                                              # inductor's kernels tuned, for both models
    python benchmarks/pretrain_gpu.py --part models --batch 64 --rounds 2 --profile --tag h100_fused
                                                              # the tables with the fused-loss row

It needs ``transformers`` (``pip install transformers``), which the book itself does not.

Both models get the same shape (12 layers, 12 heads, width 768, context 1024, vocabulary 50,304),
the same settings (bf16 autocast, PyTorch's SDPA attention, ``torch.compile``, no dropout, exact
GELU, tied embeddings) and the same step: forward, backward and a fused ``torch.optim.AdamW`` on
the same batches. The book's GPT runs twice: with the plain head and ``F.cross_entropy``, and
with its fused head and loss (``model.fused_loss``, whose row kernel is Triton on a GPU). The
three take turns, ``--rounds`` times, each turn in a fresh process, and the table keeps each
one's median tokens/s.

The second table is the book's own trainer, ``torchrun --nproc_per_node=1 -m posttrainllm.pretrain
--config gpt2-small`` (NCCL on a GPU): 40 steps, checkpoints at 20 and 40; the same run again;
then the first run's step-40 checkpoint deleted and the command repeated, so it resumes from step
20. GPU kernels need not repeat their sums in the same order (some accumulate with atomic adds),
so the resumed losses are compared with the run-to-run spread.

MFU (model FLOPs utilisation) divides the FLOPs per token that ``common.gpt_flops_per_token``
counts (PaLM's ``6 N + 12 L d T``) times tokens/s by the GPU's dense bf16 peak, 989 TFLOP/s for
an H100 or H200 SXM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, alone, gpt_flops_per_token, nvidia_driver, peak_bf16, result_suffix, write_result  # noqa: E402

SHAPE = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50304}
SMOKE = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64, "vocab_size": 512}
FUSED = "posttrainllm, fused loss"
MODELS = ("posttrainllm", FUSED, "transformers")


def build(name: str, shape: dict):
    import torch

    if name.startswith("posttrainllm"):
        from posttrainllm.model import GPT, GPTConfig

        model = GPT(GPTConfig(**shape, attention="sdpa"))
        model.fused_loss = name == FUSED
        return model, lambda x, y: model(x, y)[1]
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_embd"],
                        n_positions=shape["block_size"], vocab_size=shape["vocab_size"], activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa", dtype=torch.float32)

    def loss(x, y):
        logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    return model, loss


def measure(name: str, shape: dict, batch: int, steps: int, warmup: int, compile_: str | None,
            sdpa: str = "default", profile: bool = False, tune: bool = False) -> dict:
    """Tokens/s of ``steps`` training steps after ``warmup`` (compilation happens there).

    ``compile_`` is a ``torch.compile`` mode (None: eager); ``sdpa`` pins SDPA's kernel; with
    ``profile``, the result also holds the GPU kernels' share of the timed steps, largest first;
    with ``tune``, inductor tunes each generated kernel's block sizes by coordinate descent."""
    import contextlib

    import torch._inductor.config

    torch._inductor.config.coordinate_descent_tuning = tune

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    with sdpa_kernel(backends[sdpa]) if sdpa in backends else contextlib.nullcontext():
        return _measure(name, shape, batch, steps, warmup, compile_, profile)


def _measure(name: str, shape: dict, batch: int, steps: int, warmup: int, compile_: str | None,
             profile: bool) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model, loss_fn = build(name, shape)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    if compile_:
        loss_fn = torch.compile(loss_fn, mode=None if compile_ == "default" else compile_)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, shape["vocab_size"], (batch, shape["block_size"] + 1), generator=generator).to(device)
    inputs, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    began = time.perf_counter()
    for _ in range(steps):
        last = step()
    sync()
    seconds = time.perf_counter() - began
    result = {"tokens_per_s": batch * shape["block_size"] * steps / seconds, "n_params": n_params,
              "loss": float(last), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    if profile:
        result["kernels"] = kernel_shares(step, device)
    return result


def kernel_shares(step, device: str, steps: int = 5) -> list[tuple[str, float]]:
    """Every kernel's share of the device time over ``steps`` profiled steps, largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    total = sum(getattr(e, attr) for e in events)
    events.sort(key=lambda e: -getattr(e, attr))
    return [(e.key, getattr(e, attr) / total) for e in events]


# What a kernel does, from its name: cuBLAS's GEMMs (nvjet, and its split-K reductions),
# cuDNN's or FlashAttention's attention, Triton (inductor's fused elementwise work and
# reductions: layer norms, GELU, softmax of the loss, casts; and the fused loss's row kernel),
# the fused optimizer.
KINDS = {"matrix multiplies": ("nvjet", "gemm", "cublas", "cutlass", "xmma", "splitk", "aten::mm", "aten::addmm"),
         "attention": ("sdpa", "flash", "fmha", "cudnn"),
         "fused elementwise (Triton)": ("triton_", "cross_entropy_rows"),
         "optimizer": ("multi_tensor_apply",)}


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, marks in KINDS.items() if any(m in name for m in marks)), "other")


def shares_by_kind(kernels: list[tuple[str, float]]) -> dict[str, float]:
    out = dict.fromkeys([*KINDS, "other"], 0.0)
    for kernel, share in kernels:
        out[kind_of(kernel)] += share
    return out


def head_drift(shape: dict, batch: int = 8) -> list[list]:
    """The plain and the fused head's bf16 loss and gradients against the plain head's in fp32, on
    the same weights and batch (a tenth of the targets ignored, as an SFT prompt's would be)."""
    import copy

    import torch

    from posttrainllm.fused_cross_entropy import IGNORE_INDEX
    from posttrainllm.model import GPT, GPTConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT(GPTConfig(**shape, attention="sdpa")).to(device)
    ids = torch.randint(0, shape["vocab_size"], (batch, shape["block_size"] + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].clone()
    targets[0, : shape["block_size"] // 10 * batch] = IGNORE_INDEX

    def run(fused: bool, bf16: bool) -> tuple[float, dict]:
        copy_ = copy.deepcopy(model)
        copy_.fused_loss = fused
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = copy_(inputs, targets)[1]
        loss.backward()
        return loss.item(), {name: p.grad.float() for name, p in copy_.named_parameters()}

    exact_loss, exact = run(False, False)
    rows = []
    for label, fused in (("plain head, bf16", False), ("fused head, bf16", True)):
        loss, grads = run(fused, True)
        worst = max(((grads[k] - g).norm() / g.norm()).item() for k, g in exact.items())
        rows.append([label, f"{abs(loss - exact_loss) / exact_loss:.1e}", f"{worst:.1e}"])
    return rows


def trainer_runs(steps: int = 40) -> tuple[list[list], str]:
    """The torchrun trainer twice from scratch, then resumed from the first run's middle checkpoint."""
    from posttrainllm import pretrain

    overrides = [f"steps={steps}", f"save_every={steps // 2}", "grad_accum=1"]
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp) / "first", Path(tmp) / "second"
        whole = pretrain.launch(first, overrides, config="gpt2-small", torchrun=True, timeout=300)
        speeds = [json.loads(line)["tokens_per_s"] for line in (first / "log.jsonl").read_text().splitlines()]
        again = pretrain.launch(second, overrides, config="gpt2-small", torchrun=True, timeout=300)
        shutil.rmtree(first / f"step-{steps:06d}")
        resumed = pretrain.launch(first, overrides, config="gpt2-small", torchrun=True, timeout=300)
    half = steps // 2

    def spread(run: list[float]) -> float:
        return max(abs(x - y) / abs(x) for x, y in zip(whole[half:], run[half:], strict=True))

    rows = [[label, f"{run[half - 1]:.4f}", f"{run[-1]:.4f}", f"{spread(run):.1e}"]
            for label, run in (("first run", whole), ("second run, from scratch", again),
                               (f"first run resumed from step {half}", resumed))]
    notes = (f"tokens/s of the first run over steps {half + 1}-{steps} (median; the trainer's own step, "
             f"the book's AdamW, clipping, a log line a step): {statistics.median(speeds[half:]):,.0f}.")
    return rows, notes


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny shape, a few steps, no compile: a smoke test")
    parser.add_argument("--part", choices=("all", "models", "trainer", "drift"), default="all",
                        help="drift: only the fused head's drift table")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tag", help="appended to the result files' names (default: none on an H200, else "
                        "the GPU's model, e.g. h100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[16],
                        help="rows of 1024 tokens per step; several give a row each")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--tune", action="store_true", help="inductor's coordinate-descent tuning of the block "
                        "sizes of the kernels it generates, for both models (slower compilation)")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead"))
    parser.add_argument("--sdpa", choices=("default", "flash", "cudnn", "efficient"), default="default",
                        help="pin scaled_dot_product_attention's kernel (default: PyTorch picks)")
    parser.add_argument("--profile", action="store_true",
                        help="print each model's largest GPU kernels after its first run")
    args = parser.parse_args(argv)
    if not args.quick and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --quick, or on a machine with a GPU")
    shape = SMOKE if args.quick else SHAPE
    steps, warmup = (3, 1) if args.quick else (args.steps, args.warmup)
    compile_ = None if args.quick else args.compile_mode
    facts = (f"driver {nvidia_driver()}, torch {torch.__version__}, "
             f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else 'none'}, "
             f"{datetime.date.today().isoformat()}")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    tag = result_suffix(args.tag, gpu)
    if args.part in ("all", "models", "drift"):
        write_result(f"pretrain_gpu_head_drift{tag}", f"The fused head's drift on one {gpu}: bf16 loss and gradients "
                     "against the plain head's in fp32", ["head", "loss, relative difference",
                     "largest gradient difference, relative to its norm"], alone(head_drift, shape),
                     f"{gpu}, {facts}. The book's GPT at the models' shape, 8 rows, a tenth of the targets ignored; "
                     "every parameter's gradient compared, the largest difference kept.", out_dir=args.out)
    if args.part == "drift":
        return
    if args.part in ("all", "trainer") and not args.quick:
        rows, notes = trainer_runs()
        write_result("pretrain_torchrun_gpu", f"The torchrun trainer at GPT-2 small's shape on one "
                     f"{torch.cuda.get_device_name()}: loss after a resume", ["run", "loss at step 20",
                     "loss at step 40", "largest relative difference from the first run, steps 21-40"],
                     rows, f"{torch.cuda.get_device_name()}, {facts}. bf16, SDPA, torch.compile, NCCL, 1 process, "
                     f"micro-batch 16 x 1024 tokens. {notes}", out_dir=args.out)
    if args.part == "trainer":
        return
    rows, kinds, gpu = [], [], "cpu"
    for batch in args.batch:
        runs: dict[str, list[dict]] = {name: [] for name in MODELS}
        for _ in range(args.rounds):
            for name in runs:  # they take turns, so drift over the run hits all alike
                runs[name].append(alone(measure, name, shape, batch, steps, warmup, compile_, args.sdpa,
                                        args.profile and not runs[name], args.tune))
                if "kernels" in runs[name][-1]:
                    kernels = runs[name][-1]["kernels"]
                    print(f"{name}, batch {batch}: share of device time by kernel")
                    for kernel, share in kernels[:25]:
                        print(f"  {100 * share:5.1f}%  {kernel[:90]}")
                    kinds.append([name, batch, *(f"{100 * v:.1f}%" for v in shares_by_kind(kernels).values())])
        gpu = runs["posttrainllm"][0]["device"]
        peak = peak_bf16(gpu)
        baseline = statistics.median(r["tokens_per_s"] for r in runs["transformers"])
        for name, measured in runs.items():
            rate = statistics.median(r["tokens_per_s"] for r in measured)
            flops = gpt_flops_per_token(measured[0]["n_params"], argparse.Namespace(**shape))
            mfu = f"{100 * rate * flops / peak:.1f}%" if peak else "n/a"
            rows.append([name, batch, f"{measured[0]['n_params'] / 1e6:.1f}M", f"{rate:,.0f}", mfu,
                         f"{rate / baseline:.2f}x"])
    peak = peak_bf16(gpu)
    tuned = args.tune and compile_  # eager runs (--quick) generate no kernels to tune
    notes = (f"{gpu}, {facts}, transformers {__import__('transformers').__version__}. "
             f"Rows of {shape['block_size']} tokens, bf16 autocast, SDPA, "
             f"{'eager' if args.quick else f'torch.compile (mode {args.compile_mode})'}, "
             f"SDPA kernel {args.sdpa}, "
             f"{'coordinate-descent tuning of inductor kernels, ' if tuned else ''}fused AdamW; "
             f"median of {args.rounds} runs of {steps} steps after {warmup}, each run in a fresh process. "
             f"MFU: 6N + 12 L d T FLOPs per token over a dense bf16 peak of "
             f"{peak / 1e12 if peak else 'unknown'} TFLOP/s.")
    on = f"{gpu}, inductor's kernels tuned" if tuned else gpu
    write_result(f"pretrain_gpu{tag}", f"GPT-2 small's shape on one {on}: the book's GPT beside transformers' GPT-2",
                 ["model", "batch", "parameters", "tokens/s", "MFU", "vs transformers"], rows, notes, out_dir=args.out)
    if kinds:
        marks = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in KINDS.items())
        write_result(f"pretrain_gpu_kernels{tag}", f"Where a training step's GPU time goes on {on}, by kind of kernel",
                     ["model", "batch", *KINDS, "other"], kinds,
                     f"{gpu}, {facts}. Share of the GPU's kernel time over 5 profiled steps (torch.profiler), "
                     f"after the first run's timed steps, same settings as pretrain_gpu{tag}.json. Kinds read from the "
                     f"kernel names ({marks}); the rest is other.",
                     out_dir=args.out)


if __name__ == "__main__":
    main()
