"""The KV cache's CPU memory straight from the OS: a private anonymous mapping as a tensor.

The kernel hands such a mapping out zero-filled and faults its pages in on first write, so
`zeroed` is torch.zeros that costs nothing until written: torch.zeros wrote the default 1 GiB
cache at start-up (~0.5 s here), and kept it all resident however little of it was used.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype, device=device), on the CPU without writing it."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # The tensor holds the buffer (and so the mapping) for as long as it lives.
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)
