"""A quantized layer's weights as the kernels read them: runs of output columns in one format.

A fused projection (q|k|v, gate|up) may store its parts in different GGUF formats; each run of
consecutive parts of one format is one kernel call. A run keeps its parts as they came from
the loader (views of the memory-mapped file: no copy) and makes, on first use, what a mode
needs: the packed tiles (kernels/cpu pack_tiles; the integer activation modes, and float32 on
AVX-512 for three formats) or the parts' blocks concatenated (the float32 path elsewhere, and
dequantisation). So the default int16 path holds the tiles in memory and nothing else: the
file's pages can be handed back once the tiles are made (GGUFFile.release_pages).
"""

from __future__ import annotations

import torch

from kernels.cpu import TILE_ROWS, QuantizedWeight, concat_rows, pack_parts


class WeightRun:
    """Consecutive output columns of one layer stored in one format."""

    def __init__(self, parts: list[QuantizedWeight], columns: slice) -> None:
        self.parts = parts
        self.columns = columns
        self.qtype = parts[0].qtype
        self.type_name = parts[0].type_name
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)
        self._blocks: QuantizedWeight | None = None
        self._tiles: torch.Tensor | None = None

    def blocks(self) -> QuantizedWeight:
        """The run's blocks as one [out_features, row_bytes] weight (a copy when it has several
        parts, made once)."""
        if self._blocks is None:
            self._blocks = self.parts[0] if len(self.parts) == 1 else concat_rows(self.parts)
        return self._blocks

    def tiles(self) -> torch.Tensor | None:
        """The run packed into tiles of 16 columns (made once), or None without the native
        library."""
        if self._tiles is None:
            self._tiles = pack_parts(self.packed_parts())
        return self._tiles

    def packed_parts(self) -> list[QuantizedWeight]:
        """What the tiles are packed from: the parts themselves when every part but the last
        fills whole tiles (each packed into its rows: no concatenated copy of the blocks),
        else the blocks concatenated."""
        whole = all(part.out_features % TILE_ROWS == 0 for part in self.parts[:-1])
        return self.parts if whole else [self.blocks()]

    def set_tiles(self, tiles: torch.Tensor) -> None:
        """Tiles packed for this run elsewhere (pack_runs, a whole model in one call)."""
        self._tiles = tiles

    def nbytes(self) -> int:
        """Bytes this run holds of its own (the parts are the file's)."""
        own = [t for t in (self._tiles,) if t is not None]
        if self._blocks is not None and len(self.parts) > 1:
            own.append(self._blocks.data)
        return sum(t.numel() * t.element_size() for t in own)


def runs_of(parts: list[QuantizedWeight]) -> list[WeightRun]:
    """Consecutive parts of one format grouped into runs, with their output columns."""
    groups: list[list[QuantizedWeight]] = []
    for part in parts:
        if groups and (groups[-1][0].qtype, groups[-1][0].in_features) == (
            part.qtype,
            part.in_features,
        ):
            groups[-1].append(part)
        else:
            groups.append([part])
    if len({group[0].in_features for group in groups}) != 1:
        raise ValueError("the parts of one linear layer must have the same input width")
    runs, start = [], 0
    for group in groups:
        width = sum(part.out_features for part in group)
        runs.append(WeightRun(group, slice(start, start + width)))
        start += width
    return runs
