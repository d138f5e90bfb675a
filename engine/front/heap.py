"""The Python heap of a serving process and its cyclic garbage collector.

Start-up builds a large object graph that lives as long as the process (torch's, the web
stack's and the tokenizer's objects, the model). The collector's full passes walk all of it:
on the 2-core VM one full collection took ~150 ms with SmolLM2 loaded (~190k tracked objects);
frozen, a full pass walks only what serving allocated since, 3-12 ms in a policy sweep's cells
(docs/benchmarks.md §5y). A full pass lands in whichever engine step allocates past the
threshold, and on a GPU, where a decode step takes 2-5 ms, 150 ms is dozens of steps. So a serving process freezes what start-up built
(collection_paused_then_frozen); CollectorPauses measures what the collector still costs.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_paused_then_frozen() -> Iterator[None]:
    """The cyclic collector off for the block, then everything allocated so far frozen
    (gc.freeze: never scanned again). The collector's full passes over a load freed nothing
    worth having (~7k import-time functions and tuples, no tensors) and cost ~0.2 s of a ~3 s
    start (docs/benchmarks.md "Start-up time"). Frozen objects are still freed when their
    reference count drops; only reference cycles among them are never collected."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class CollectorPauses:
    """The collector's passes while active (a context manager): how many, and their seconds,
    all and full (generation 2) apart."""

    def __init__(self) -> None:
        self.count = self.full_count = 0
        self.seconds = self.full_seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._on_pass)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._on_pass)

    def _on_pass(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        seconds = time.perf_counter() - self._start
        self.count += 1
        self.seconds += seconds
        if info["generation"] == 2:
            self.full_count += 1
            self.full_seconds += seconds

    def as_dict(self) -> dict:
        return dict(
            gc_passes=self.count,
            gc_seconds=round(self.seconds, 4),
            gc_full_passes=self.full_count,
            gc_full_seconds=round(self.full_seconds, 4),
        )
