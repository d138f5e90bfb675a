"""Cost per row of sampling by the exponential race (kernels/sampling.py) against the inverse
CDF it replaced (one uniform per row, a float64 cumsum and a search), on CPU; and the argmax
every greedy row and race takes (kernels' argmax_rows against torch.argmax).

For each vocabulary (SmolLM2 49152, Qwen 151936) and batch of rows: the race's noise alone
(native kernel, and its PyTorch twin), the whole race (noise, -log, p / E, argmax), the
inverse CDF and the argmax alone (argmax_rows, torch.argmax), medians over --repeats timed
calls, in ms per row.

    .venv/bin/python benchmarks/race_cost.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.sample.rng import race_keys  # noqa: E402
from kernels.sampling import (  # noqa: E402
    argmax_rows,
    race_uniforms,
    race_uniforms_torch,
    sample_from_probs,
)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The replaced sampler, for comparison."""
    cdf = probs.double().cumsum(dim=-1)
    target = uniforms.double()[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for vocab in (49152, 151936):
        for rows in args.rows:
            timed = cases(vocab, rows)
            cells = [
                f"{name} {median_ms(fn, args.repeats) / rows:6.3f}" for name, fn in timed.items()
            ]
            print(f"V={vocab:6d} rows={rows:2d}  ms/row: " + "  ".join(cells), flush=True)


def cases(vocab: int, rows: int) -> dict:
    """The timed calls on `rows` random rows of a `vocab`-token distribution."""
    probs = torch.softmax(torch.randn(rows, vocab) * 3, dim=-1)
    keys = torch.from_numpy(race_keys(range(rows), [0] * rows))
    uniforms = torch.rand(rows, dtype=torch.float64)
    return {
        "noise native": lambda: race_uniforms(keys, vocab),
        "noise torch": lambda: race_uniforms_torch(keys, vocab),
        "race": lambda: sample_from_probs(probs, keys),
        "inverse cdf": lambda: inverse_cdf(probs, uniforms),
        "argmax_rows": lambda: argmax_rows(probs),
        "torch argmax": lambda: probs.argmax(dim=-1),
    }


if __name__ == "__main__":
    main()
