"""ReferenceBackend against a naive dense attention over the full K/V sequences.

Each case scatters every request's history into randomly chosen (non-contiguous) blocks, runs
one forward with the new tokens, and compares with softmax(q k^T) v computed from the dense
sequences with explicit masks.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from kernels.attention import AttentionMetadata, KVCacheSpec
from kernels.reference import ReferenceBackend

BLOCK_SIZE = 4
NUM_BLOCKS = 64
HEAD_DIM = 8
CPU = torch.device("cpu")


@dataclass
class Case:
    """One request: `history` cached tokens, `q_len` new ones, optional tree mask."""

    history: int
    q_len: int
    tree_mask: torch.Tensor | None = None


def random_tree_mask(q_len: int, gen: torch.Generator) -> torch.Tensor:
    """A random tree over q_len nodes (node 0 the root): each node sees itself and its ancestors."""
    mask = torch.eye(q_len, dtype=torch.bool)
    for node in range(1, q_len):
        parent = int(torch.randint(0, node, (1,), generator=gen))
        mask[node] |= mask[parent]
    return mask


def naive_attention(q, k, v, mask, scale):
    """q [Q, H, D], k/v [S, Hkv, D], mask [Q, S] bool -> [Q, H, D]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,shd->hqs", q, k) * scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v)


def dense_mask(case: Case) -> torch.Tensor:
    seq_len = case.history + case.q_len
    if case.tree_mask is not None:
        visible = torch.ones(case.q_len, case.history, dtype=torch.bool)
        return torch.cat([visible, case.tree_mask], dim=1)
    query_pos = torch.arange(case.history, seq_len)
    return torch.arange(seq_len)[None, :] <= query_pos[:, None]


def place_requests(cases, gen):
    """Random non-contiguous blocks per request -> (metadata, slots of every token per request)."""
    free_blocks = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    max_blocks = max(math.ceil((c.history + c.q_len) / BLOCK_SIZE) for c in cases)
    block_tables = torch.zeros(len(cases), max_blocks, dtype=torch.int32)
    all_slots = []
    for i, case in enumerate(cases):
        num_blocks = math.ceil((case.history + case.q_len) / BLOCK_SIZE)
        blocks = torch.tensor([free_blocks.pop() for _ in range(num_blocks)])
        block_tables[i, :num_blocks] = blocks
        pos = torch.arange(case.history + case.q_len)
        all_slots.append(blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
    query_lens = [c.q_len for c in cases]
    seq_lens = [c.history + c.q_len for c in cases]
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        slot_mapping=torch.cat([s[c.history :] for s, c in zip(all_slots, cases, strict=True)]),
        query_lens_host=tuple(query_lens),
        seq_lens_host=tuple(seq_lens),
        tree_masks=tuple(c.tree_mask for c in cases),
    )
    return metadata, all_slots


def write_history(cache, cases, all_slots, full_k, full_v):
    for case, slots, k, v in zip(cases, all_slots, full_k, full_v, strict=True):
        hist = slots[: case.history].to(cache.device)
        cache[hist // BLOCK_SIZE, 0, hist % BLOCK_SIZE] = k[: case.history].to(cache.device)
        cache[hist // BLOCK_SIZE, 1, hist % BLOCK_SIZE] = v[: case.history].to(cache.device)


def to_device(metadata, device):
    moved = {
        f.name: getattr(metadata, f.name).to(device)
        for f in dataclasses.fields(metadata)
        if isinstance(getattr(metadata, f.name), torch.Tensor)
    }
    masks = tuple(None if m is None else m.to(device) for m in metadata.tree_masks)
    return dataclasses.replace(metadata, **moved, tree_masks=masks)


def run_case(cases, num_heads=4, num_kv_heads=2, num_layers=2, seed=0, device=CPU):
    """Returns (outputs per layer, expected per layer, backend, slots of each request).

    Inputs are drawn on the CPU; with another `device` the backend runs there and its
    outputs come back to the CPU for comparison."""
    gen = torch.Generator().manual_seed(seed)
    backend = ReferenceBackend()
    backend.allocate(
        KVCacheSpec(
            num_layers, NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, HEAD_DIM, torch.float32, device
        )
    )
    metadata, all_slots = place_requests(cases, gen)
    backend.plan(to_device(metadata, device))
    scale = HEAD_DIM**-0.5
    new = [slice(c.history, None) for c in cases]
    outputs, expected = [], []
    for layer in range(num_layers):
        seq = [(c.history + c.q_len, num_kv_heads, HEAD_DIM) for c in cases]
        full_k = [torch.randn(shape, generator=gen) for shape in seq]
        full_v = [torch.randn(shape, generator=gen) for shape in seq]
        q = [torch.randn(c.q_len, num_heads, HEAD_DIM, generator=gen) for c in cases]
        write_history(backend.kv_caches[layer], cases, all_slots, full_k, full_v)
        new_k = torch.cat([k[s] for k, s in zip(full_k, new, strict=True)])
        new_v = torch.cat([v[s] for v, s in zip(full_v, new, strict=True)])
        args = (torch.cat(q).to(device), new_k.to(device), new_v.to(device))
        outputs.append(backend.forward(layer, *args, scale).cpu())
        dense = zip(q, full_k, full_v, cases, strict=True)
        expected.append(
            torch.cat([naive_attention(*x[:3], dense_mask(x[3]), scale) for x in dense])
        )
        # The new tokens' K/V must now sit in the cache at their slots.
        slots, cache = metadata.slot_mapping, backend.kv_caches[layer].cpu()
        torch.testing.assert_close(cache[slots // BLOCK_SIZE, 0, slots % BLOCK_SIZE], new_k)
        torch.testing.assert_close(cache[slots // BLOCK_SIZE, 1, slots % BLOCK_SIZE], new_v)
    return outputs, expected, backend, all_slots


def assert_matches(cases, **kw):
    outputs, expected, _, _ = run_case(cases, **kw)
    for out, ref in zip(outputs, expected, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_mixed_batch_prefill_chunks_and_decodes(num_heads, num_kv_heads):
    cases = [Case(0, 7), Case(5, 1), Case(9, 6), Case(13, 1), Case(0, 1), Case(3, 1)]
    assert_matches(cases, num_heads=num_heads, num_kv_heads=num_kv_heads)


def test_pure_decode_equal_lengths():
    assert_matches([Case(11, 1), Case(11, 1), Case(11, 1)])


def test_pure_decode_ragged_lengths():
    assert_matches([Case(1, 1), Case(17, 1), Case(6, 1), Case(30, 1)])


def test_single_request_prefill_and_decode():
    assert_matches([Case(0, 13)])
    assert_matches([Case(13, 1)])


def test_tree_masks_next_to_chains_and_decodes():
    gen = torch.Generator().manual_seed(3)
    cases = [
        Case(6, 5, random_tree_mask(5, gen)),
        Case(2, 1),
        Case(10, 4),  # verify chain: causal over the new tokens
        Case(0, 7, random_tree_mask(7, gen)),
        Case(9, 1, torch.ones(1, 1, dtype=torch.bool)),  # single-node tree
    ]
    assert_matches(cases, num_heads=4, num_kv_heads=2)


def test_tree_mask_differs_from_causal():
    """Guards against a backend that ignores tree masks: a branching tree must change outputs."""
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree_out, _, _, _ = run_case([Case(4, 3, tree)], num_layers=1, seed=5)
    chain_out, _, _, _ = run_case([Case(4, 3)], num_layers=1, seed=5)
    assert torch.allclose(tree_out[0][:2], chain_out[0][:2], atol=1e-6)
    assert not torch.allclose(tree_out[0][2], chain_out[0][2], atol=1e-3)


def test_copy_slots_copies_k_and_v_in_every_layer():
    _, _, backend, slots = run_case([Case(3, 5), Case(0, 6)], num_layers=3)
    src, dst = slots[0][:4], slots[1][2:6]
    before = [cache.clone() for cache in backend.kv_caches]
    backend.copy_slots(src, dst)
    for layer, cache in enumerate(backend.kv_caches):
        for kv in (0, 1):
            torch.testing.assert_close(
                cache[dst // BLOCK_SIZE, kv, dst % BLOCK_SIZE],
                before[layer][src // BLOCK_SIZE, kv, src % BLOCK_SIZE],
            )
        # Everything outside dst is untouched.
        untouched = torch.ones(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
        untouched[dst] = False
        flat_now = cache.transpose(1, 2).reshape(NUM_BLOCKS * BLOCK_SIZE, 2, -1)
        flat_before = before[layer].transpose(1, 2).reshape(NUM_BLOCKS * BLOCK_SIZE, 2, -1)
        assert torch.equal(flat_now[untouched], flat_before[untouched])


def test_decodes_split_into_length_sorted_groups(monkeypatch):
    """A small gather budget forces several padded groups whose rows are out of order."""
    import kernels.reference

    bytes_per_token = 2 * 2 * HEAD_DIM * 4  # K+V, 2 KV heads, float32
    monkeypatch.setattr(kernels.reference, "GATHER_BUDGET_BYTES", 24 * bytes_per_token)
    cases = [Case(4, 1), Case(16, 1), Case(8, 1), Case(0, 5), Case(29, 1), Case(1, 1), Case(9, 1)]
    outputs, expected, backend, _ = run_case(cases, num_heads=4, num_kv_heads=2)
    groups = [group.query_rows.tolist() for group in backend._plans[0][0]]
    assert len(groups) > 2 and sorted(sum(groups, [])) == [0, 1, 2, 8, 9, 10]
    for out, ref in zip(outputs, expected, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_dense_attention():
    gen = torch.Generator().manual_seed(7)
    cases = [Case(0, 7), Case(5, 1), Case(9, 6), Case(13, 1), Case(6, 5, random_tree_mask(5, gen))]
    outputs, expected, _, _ = run_case(cases, device=torch.device("cuda"))
    for out, ref in zip(outputs, expected, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
