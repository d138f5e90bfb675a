"""The batch-1 decode bound of a GGUF on this machine: measured read bandwidth / bytes read per
generated token.

Batch-1 decode is memory-bound: each token reads every weight of the model once, and nothing
the arithmetic does can make it faster than the memory delivers those bytes. The bytes per token
are the GGUF's tensor bytes, all of them but the token embedding, of which a token reads one row;
when the model has no `output.weight` its head is the (tied) embedding, read whole. The KV cache
is left out: at these context lengths it is a few percent of the weights.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

EMBEDDING = "token_embd.weight"
HEAD = "output.weight"


def bytes_per_token(tensors: Iterable[tuple[str, int]]) -> int:
    """Bytes a decode step reads, from (GGUF tensor name, its bytes) pairs."""
    sizes = dict(tensors)
    read = sum(size for name, size in sizes.items() if name != EMBEDDING)
    if HEAD not in sizes:  # tied head: the logits read the whole embedding
        read += sizes.get(EMBEDDING, 0)
    return read


def gguf_bytes_per_token(path: str | Path) -> int:
    """bytes_per_token of a GGUF file (its header only; the data stays unread)."""
    from engine.models.gguf_file import read_gguf

    return bytes_per_token((t.name, t.data.nbytes) for t in read_gguf(path).tensors)


def read_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second of a float32 sum over `gib` GiB with `threads` threads, best of
    `repeats`: a streaming read as the decode kernels do it, far larger than any cache, on
    huge pages as the packed weights are (kernels/cpu/huge_pages.py; 4 KiB pages read ~5%
    slower here)."""
    import torch

    from kernels.cpu.huge_pages import empty_bytes

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = empty_bytes(int(gib * 2**30) // 4 * 4).view(torch.float32)
        data.fill_(1.0)  # every page touched
        data.sum()  # first pass outside the timing: thread pool start
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
        return data.numel() * 4 / best
    finally:
        torch.set_num_threads(before)


def decode_bound(bandwidth: float, per_token: int) -> float:
    """Tokens per second the bandwidth allows at batch 1."""
    return bandwidth / per_token if per_token else 0.0
