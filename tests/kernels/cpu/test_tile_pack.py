"""Packing weights into tiles (csrc/tile_pack.h) at load: the parts of a fused projection packed
into one tensor equal the packing of their stacked blocks byte for byte, `out` is checked, and
Q6_K's tiles match a numpy packer written from the layout in tile_pack.h's header comment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import TILE_ROWS, QuantizedWeight, concat_rows, pack_parts, pack_runs, pack_tiles
from tests.kernels.cpu.quant_cases import FORMATS, Q


def rows_of(weight: QuantizedWeight, start: int, stop: int) -> QuantizedWeight:
    return weight.with_rows(weight.data[start:stop])


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_parts_packed_into_one_tensor_equal_the_stacked_blocks_packed(native, quant_cases, qtype):
    weight = quant_cases[qtype].weight  # 37 rows: parts of 16, 16 and a last one of 5
    parts = [rows_of(weight, 0, 16), rows_of(weight, 16, 32), rows_of(weight, 32, 37)]
    packed = pack_parts(parts)
    assert torch.equal(packed, pack_tiles(concat_rows(parts)))
    assert torch.equal(packed, pack_tiles(weight))


def test_pack_parts_refuses_parts_that_do_not_fill_whole_tiles(native, quant_cases):
    weight = quant_cases[Q.Q4_0].weight
    with pytest.raises(ValueError, match="whole tiles"):
        pack_parts([rows_of(weight, 0, 5), rows_of(weight, 5, 21)])
    with pytest.raises(ValueError, match="one format"):
        pack_parts([rows_of(weight, 0, 16), quant_cases[Q.Q8_0].weight])


def test_pack_tiles_writes_into_out_and_checks_it(native, quant_cases):
    weight = quant_cases[Q.Q4_K].weight
    width = native.tile_bytes(weight.qtype, weight.in_features)
    out = torch.full((3, width), 7, dtype=torch.uint8)
    result = native.pack_tiles(weight.data, weight.qtype, weight.in_features, out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out, pack_tiles(weight))
    for bad in (torch.empty(2, width, dtype=torch.uint8), torch.empty(3, width)):
        with pytest.raises(RuntimeError, match="out must be"):
            native.pack_tiles(weight.data, weight.qtype, weight.in_features, bad)


def q6k_tiles_reference(blocks: np.ndarray, num_rows: int) -> np.ndarray:
    """Q6_K tiles as tile_pack.h's header describes them, from gguf's element order."""
    n_blocks = blocks.shape[1] // 210
    b = blocks.reshape(num_rows, n_blocks, 210).astype(np.int64)
    ql, qh, scales, d = b[..., :128], b[..., 128:192], b[..., 192:208], b[..., 208:210]
    e = np.arange(256)
    h, g, lane = e // 128, (e % 128) // 32, e % 32
    byte = ql[..., 64 * h + 32 * (g % 2) + lane]
    low = np.where(g < 2, byte & 0x0F, byte >> 4)
    top = (qh[..., 32 * h + lane] >> (2 * g)) & 3  # [rows, blocks, 256] each
    tiles = []
    for n0 in range(0, num_rows, TILE_ROWS):
        cols = slice(n0, n0 + TILE_ROWS)
        per_block = []
        for i in range(n_blocks):
            out = np.zeros(210 * TILE_ROWS, dtype=np.int64)
            width = min(TILE_ROWS, num_rows - n0)
            out[: 2 * width] = d[cols, i].reshape(-1)
            for s in range(16):
                out[32 + 16 * s : 32 + 16 * s + width] = scales[cols, i, s]
            for grp in range(8):
                base = 288 + 384 * grp
                for v in range(4):
                    for t in range(4):
                        lo, hi = 32 * grp + 4 * v + t, 32 * grp + 16 + 4 * v + t
                        at = 4 * np.arange(width) + t
                        l_lo, l_hi = low[cols, i, lo], low[cols, i, hi]
                        out[base + 64 * v + at] = l_lo | (l_hi << 4)
                        out[base + 256 + at] |= top[cols, i, lo] << (2 * v)
                        out[base + 320 + at] |= top[cols, i, hi] << (2 * v)
            per_block.append(out)
        tiles.append(np.concatenate(per_block))
    return np.stack(tiles).astype(np.uint8)


def test_q6k_tiles_match_the_documented_layout(native, quant_cases):
    weight = quant_cases[Q.Q6_K].weight  # 37 rows: the last tile has 5 columns and 11 zero ones
    expected = q6k_tiles_reference(weight.data.numpy(), weight.out_features)
    assert np.array_equal(pack_tiles(weight).numpy(), expected)


def test_pack_runs_packs_every_run_as_pack_parts_does(native, quant_cases):
    weight = quant_cases[Q.Q6_K].weight
    runs = [
        [quant_cases[Q.Q4_K].weight],
        [rows_of(weight, 0, 16), rows_of(weight, 16, 37)],
        [quant_cases[Q.Q8_0].weight],
    ]
    packed = pack_runs(runs)
    assert len(packed) == 3
    for tiles, parts in zip(packed, runs, strict=True):
        assert torch.equal(tiles, pack_tiles(concat_rows(parts)))
    assert pack_runs([]) == []


def test_pack_runs_lays_the_runs_out_in_one_arena_a_page_apart(native, quant_cases):
    """One allocation for a model's tiles (on huge pages where the OS allows): the runs follow
    one another a whole number of 4 KiB pages apart, none overlapping."""
    runs = [[quant_cases[q].weight] for q in (Q.Q4_K, Q.Q6_K, Q.Q8_0)]
    packed = pack_runs(runs)
    starts = [tiles.data_ptr() for tiles in packed]
    assert all((start - starts[0]) % 4096 == 0 for start in starts)
    for tiles, following in zip(packed, starts[1:]):
        assert tiles.data_ptr() + tiles.numel() <= following
    assert all(tiles.is_contiguous() and tiles.dtype == torch.uint8 for tiles in packed)
