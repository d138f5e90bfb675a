"""DraftTree: a speculation tree over the request's last verified token (the root).

Nodes are in topological order: parent_ids[i] < i, and parent_ids[i] is None for children of
the root. Node i sits at position prefix_len + depth(i), where the root is at prefix_len - 1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    token_ids: tuple[int, ...]
    parent_ids: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.parent_ids):
            raise ValueError("token_ids and parent_ids must have the same length")
        for i, parent in enumerate(self.parent_ids):
            if parent is not None and not 0 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must precede it")

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Depth of each node; children of the root have depth 1."""
        depths: list[int] = []
        for parent in self.parent_ids:
            depths.append(1 if parent is None else depths[parent] + 1)
        return depths
