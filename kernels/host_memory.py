"""Zero-filled host memory the OS fills page by page, at first touch.

`torch.zeros` writes every byte at once. For the paged KV cache that is the whole cache
(a gigabyte by default) faulted in and cleared at start-up, though a request writes only the
blocks it is given: on the 2-core VM the Qwen 1.5B's 1 GiB float32 cache took 0.42 s of a
2.7 s start (docs/benchmarks.md §5m). An anonymous private mapping reads as zeros by the
kernel's contract and is backed lazily, so the clearing moves to the first write of each
page, spread over the steps that use it.
"""

from __future__ import annotations

import math
import mmap

import torch

# Below this a mapping is not worth a system call: torch.zeros.
LAZY_BYTES = 1 << 20


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype, device=device); on the CPU, from LAZY_BYTES up, over an
    anonymous mapping (zero on the OS's word, faulted in at first touch, freed with the last
    tensor viewing it)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError):  # no anonymous mmap here (Windows)
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(mapping, dtype=dtype).view(shape)
