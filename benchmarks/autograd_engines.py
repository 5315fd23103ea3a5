"""Scalar autograd vs tensor autograd vs PyTorch: one forward+backward of the same MLP.

The three engines get the same weights (exported from ``posttrainllm.nn.MLP``) and the same
batch of moons; the benchmark first checks they agree (max gradient difference), then times
each (best of several runs) and reports the ratios.

    python benchmarks/autograd_engines.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import nn  # noqa: E402
from posttrainllm.autograd import Value  # noqa: E402
from posttrainllm.measure import measure_seconds  # noqa: E402
from posttrainllm.tensor import Tensor, mlp_forward  # noqa: E402
from posttrainllm.toydata import make_moons  # noqa: E402


def scalar_step(net: nn.MLP, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    net.zero_grad()
    losses = [nn.cross_entropy(net([float(v) for v in xi]), int(t)) for xi, t in zip(x, y, strict=True)]
    (sum(losses, Value(0.0)) * (1 / len(losses))).backward()
    return np.array([[n.w[i].grad for n in net.layers[0].neurons] for i in range(x.shape[1])])


def tensor_step(weights, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    params = [(Tensor(w), Tensor(b)) for w, b in weights]
    mlp_forward(Tensor(x), params).cross_entropy(y).backward()
    return params[0][0].grad


def torch_step(weights, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    params = [(torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)) for w, b in weights]
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        h = torch.tanh(h) if i < len(params) - 1 else h
    torch.nn.functional.cross_entropy(h, y).backward()
    return params[0][0].grad.numpy()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    batch, hidden, repeats = (8, 4, 1) if args.quick else (64, 16, 5)
    x, y = make_moons(batch, seed=0)
    net = nn.MLP([2, hidden, hidden, 2], activation="tanh", seed=0)
    weights = net.weights()
    xt, yt = torch.tensor(x), torch.tensor(y)

    grads = {
        "scalar": scalar_step(net, x, y),
        "tensor": tensor_step(weights, x, y),
        "torch": torch_step(weights, xt, yt),
    }
    drift = max(float(np.abs(g - grads["torch"]).max()) for g in grads.values())
    if drift > 1e-10:
        raise SystemExit(f"the engines disagree: max gradient difference {drift:.2e}")

    seconds = {
        "scalar Value engine": measure_seconds(lambda: scalar_step(net, x, y), repeats),
        "numpy Tensor engine": measure_seconds(lambda: tensor_step(weights, x, y), repeats),
        f"PyTorch (float64, {torch.get_num_threads()} threads)": measure_seconds(
            lambda: torch_step(weights, xt, yt), repeats
        ),
    }
    fastest = min(seconds.values())
    rows = [[name, f"{s * 1e3:.3f}", f"{s / fastest:.1f}x"] for name, s in seconds.items()]
    write_result(
        "autograd_engines",
        f"One forward+backward of an MLP [2, {hidden}, {hidden}, 2] on {batch} points",
        ["engine", f"ms (best of {repeats})", "time vs fastest"],
        rows,
        f"All three engines give the same first-layer gradient (max difference {drift:.1e}).",
        args.out,
    )


if __name__ == "__main__":
    main()
