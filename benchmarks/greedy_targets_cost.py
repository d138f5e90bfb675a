"""Greedy targets on a GPU: one max reduction against argmax + gather + isfinite.

Sampler.greedy_targets returns each row's argmax and whether that row's best logit is finite;
verification then copies both to the host in one transfer. On CUDA one max(dim=-1) gives both
(Sampler.greedy_targets, timed here); the code before took argmax, then gathered the best
logit. This times the pair and its host copy, as verification runs it, for vocabulary-sized rows, the two
ways taking turns (three rounds of 500 calls each), and checks they agree.

    python benchmarks/greedy_targets_cost.py   # needs a CUDA GPU
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.sample.sampler import Sampler  # noqa: E402

one_max = Sampler.greedy_targets  # on CUDA: one max reduction
VOCAB = 49152  # SmolLM2's


def argmax_gather(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    targets = logits.argmax(dim=-1)
    best = logits.gather(-1, targets[:, None]).squeeze(-1)
    return targets, torch.isfinite(best)


def to_host(targets_of, logits: torch.Tensor) -> list[int]:
    targets, valid = targets_of(logits)
    return torch.cat([targets, valid.long()]).tolist()


def main() -> None:
    torch.manual_seed(0)
    for rows in (1, 8, 64):
        logits = torch.randn(rows, VOCAB, device="cuda")
        if to_host(one_max, logits) != to_host(argmax_gather, logits):
            raise AssertionError("the two ways disagree")
        times: dict[str, list[float]] = {}
        for _ in range(3):
            for name, targets_of in (("argmax+gather", argmax_gather), ("one max", one_max)):
                for _ in range(50):
                    to_host(targets_of, logits)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(500):
                    to_host(targets_of, logits)
                elapsed = (time.perf_counter() - start) / 500 * 1e6
                times.setdefault(name, []).append(round(elapsed, 1))
        print(rows, times, "us per call, host copy included")


if __name__ == "__main__":
    main()
