"""Memory for the packed weights on transparent huge pages.

A decode step streams every weight once: with 4 KiB pages that is a TLB miss every 4 KiB, and
in a virtual machine each miss walks two page tables. Linux backs an anonymous mapping with
2 MiB pages when asked (`madvise(MADV_HUGEPAGE)`; this machine's THP mode is `madvise`, so
nothing is backed so unless asked), and the weights, written once at load, then stay on them.
Measured on the 2-core VM (docs/benchmarks.md §5k): on small pages the first SmolLM2 engine
built in a process ran 22% slower than a second one; the Qwen 1.5B decoded 1.07-1.29x faster
on huge pages; start-up pays ~0.5 s for it (a fresh huge page is slow to fault in there).

`empty_bytes` hands out a uint8 tensor over such a mapping: 2 MiB aligned, advised before the
first write (pages are faulted in as huge pages then), freed with the last tensor viewing it.
Where the platform has no madvise or mmap refuses, it falls back to `torch.empty`.
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode() -> str:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), "unknown"
    where it does not say: with "never" the weights stay on 4 KiB pages (for the log)."""
    try:
        with open(THP_SETTING) as setting:
            text = setting.read()
    except OSError:
        return "unknown"
    chosen = text[text.find("[") + 1 : text.find("]")] if "[" in text else ""
    return chosen or "unknown"


def empty_bytes(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of `nbytes`, on huge pages where the OS allows."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advice is None:
        return torch.empty(nbytes, dtype=torch.uint8)
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to align the start
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return torch.empty(nbytes, dtype=torch.uint8)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    start = -whole.data_ptr() % HUGE_PAGE
    try:
        mapping.madvise(advice, start, size - start)
    except OSError:
        pass  # no THP here: the mapping still works with small pages
    return whole[start : start + nbytes]
