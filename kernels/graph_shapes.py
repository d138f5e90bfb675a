"""GraphShapes: which step shapes a model runner replays as captured CUDA graphs.

A step replays a graph when it has at most max(batch_sizes) requests, every request has at
most max_query_len new rows (a decode: 1; a chain verification: 1 + k; a short prefill chunk
counts the same) and no request carries a tree mask. The runner pads such a step to the
smallest captured batch size and to the step's longest query (kernels/cuda_graphs.py); every
other step runs eagerly. Pure Python, so the speculation core (its step-time features) asks
the same question the runner answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GraphShapes:
    batch_sizes: tuple[int, ...] = ()  # captured batch sizes, ascending; () = no graphs
    max_query_len: int = 0  # captured query rows per request: 1..max_query_len

    @property
    def enabled(self) -> bool:
        return bool(self.batch_sizes)

    @property
    def eager_on_drafts(self) -> bool:
        """Graphs replay decodes alone: a step with drafts runs eagerly."""
        return self.enabled and self.max_query_len <= 1

    def replays(self, query_lens: Sequence[int], tree: bool = False) -> bool:
        """Whether a step of these per-request query lengths replays a graph."""
        return (
            self.enabled
            and not tree
            and 0 < len(query_lens) <= self.batch_sizes[-1]
            and max(query_lens) <= self.max_query_len
        )

    def padded(self, num_requests: int, query_len: int) -> tuple[int, int]:
        """The captured (batch size, query rows per request) a replayable step runs as."""
        batch = next(size for size in self.batch_sizes if size >= num_requests)
        return batch, query_len

    def all_shapes(self) -> list[tuple[int, int]]:
        """Every captured (batch size, query rows per request)."""
        return [(b, q) for b in self.batch_sizes for q in range(1, self.max_query_len + 1)]

    def decode_only(self) -> GraphShapes:
        """The same batch sizes with only decode steps replayed (a tree proposer's view: its
        verification steps carry tree masks, which always run eagerly)."""
        return GraphShapes(self.batch_sizes, min(self.max_query_len, 1))

    def describe(self) -> str:
        if not self.enabled:
            return "none"
        return f"b{self.batch_sizes[-1]}q{self.max_query_len}"


NO_GRAPHS = GraphShapes()
