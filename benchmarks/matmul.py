"""Matrix multiply on the CPU: pure-Python triple loop vs the numpy tiled model vs numpy ``@``.

The tiled model is the counted, readable version of a GPU kernel from module 3: it computes
the product in tiles with numpy, so it is far faster than the Python loop but pays Python
overhead per tile. ``@`` calls the BLAS library. All three are checked against each other.

    python benchmarks/matmul.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import matmul as mm  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sizes, naive_max, repeats = ([16, 32], 32, 1) if args.quick else ([64, 128, 256, 512], 128, 3)
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
        reference = a @ b
        flops = mm.matmul_flops(n, n, n)
        contenders = {
            "numpy tiled model (tile 32)": lambda a=a, b=b: mm.matmul_tiled(a, b, 32)[0],
            "numpy @ (BLAS)": lambda a=a, b=b: a @ b,
        }
        if n <= naive_max:
            contenders = {"Python triple loop": lambda a=a, b=b: mm.matmul_naive(a, b), **contenders}
        timings = {}
        for name, fn in contenders.items():
            np.testing.assert_allclose(fn(), reference, rtol=1e-3, atol=1e-3)
            timings[name] = mm.measure_seconds(fn, repeats)
        blas = timings["numpy @ (BLAS)"]
        for name, seconds in timings.items():
            rows.append([n, name, f"{flops / seconds / 1e9:.3f}", f"{seconds / blas:.0f}x"])
    write_result(
        "matmul",
        "float32 n x n matrix multiply on the CPU",
        ["n", "implementation", "GFLOP/s", "time vs numpy @"],
        rows,
        f"The Python loop is only run up to n = {naive_max} (it takes seconds beyond).",
        args.out,
    )


if __name__ == "__main__":
    main()
