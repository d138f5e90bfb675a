"""Test helpers for the FlashInfer backend on CPU: random paged batches and a torch emulation of
FlashInfer's two paged wrappers (plan/run), written from FlashInfer's documented semantics:

- pages of request i: kv_indices[kv_indptr[i]:kv_indptr[i+1]]; its KV length is
  (num_pages - 1) * page_size + kv_last_page_len[i]; cache [pages, 2, page_size, H_kv, D] (NHD);
- causal=True aligns the mask bottom-right: query r of a q_len-row request sees KV 0..kv_len-q_len+r;
- custom_mask: flattened bool, request i row-major [q_len_i, kv_len_i], requests back to back.

The plan() signatures list only keyword names FlashInfer 0.6 accepts, so a misspelt keyword in
the backend fails here with a TypeError.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

from kernels.attention import AttentionMetadata


@dataclass
class RequestCase:
    history: int  # tokens already cached
    q_len: int  # new tokens this step (real tokens + tree nodes)
    parent_ids: tuple[int | None, ...] | None = None  # tree nodes after num_real real tokens
    num_real: int = 1  # real tokens before the tree nodes (the root, or a chunk ending in it)

    @property
    def seq_len(self) -> int:
        return self.history + self.q_len


def random_cases(
    rng: random.Random, num_requests: int, kinds: tuple[str, ...]
) -> list[RequestCase]:
    cases = []
    for _ in range(num_requests):
        kind = rng.choice(kinds)
        if kind == "prefill":
            cases.append(RequestCase(0, rng.randint(1, 23)))
        elif kind == "chunk":
            cases.append(RequestCase(rng.randint(1, 30), rng.randint(2, 11)))
        elif kind == "decode":
            cases.append(RequestCase(rng.randint(0, 40), 1))
        elif kind == "verify":  # a chain: the last real token and 1..4 drafts
            cases.append(RequestCase(rng.randint(0, 40), rng.randint(2, 5)))
        else:  # tree: real tokens ending in the root + nodes with random earlier parents
            num_real, num_nodes = rng.randint(1, 3), rng.randint(1, 7)
            parents = tuple(
                None if i == 0 else rng.choice([None, *range(i)]) for i in range(num_nodes)
            )
            cases.append(RequestCase(rng.randint(0, 30), num_real + num_nodes, parents, num_real))
    return cases


def tree_mask(num_real: int, parent_ids: tuple[int | None, ...]) -> torch.Tensor:
    """[q_len, q_len]: real tokens causal; node n sees the real tokens, its ancestors and itself."""
    q_len = num_real + len(parent_ids)
    mask = torch.zeros(q_len, q_len, dtype=torch.bool)
    for row in range(num_real):
        mask[row, : row + 1] = True
    for node in range(len(parent_ids)):
        mask[num_real + node, :num_real] = True
        ancestor = node
        while ancestor is not None:
            mask[num_real + node, num_real + ancestor] = True
            ancestor = parent_ids[ancestor]
    return mask


def make_metadata(
    rng: random.Random,
    cases: list[RequestCase],
    block_size: int,
    num_blocks: int,
    extra_cols: int = 2,
) -> tuple[AttentionMetadata, list[list[int]]]:
    """Metadata for `cases` with random, non-contiguous, disjoint blocks per request."""
    need = [-(-c.seq_len // block_size) for c in cases]
    pool = rng.sample(range(num_blocks), sum(need))
    block_ids = [[pool.pop() for _ in range(n)] for n in need]
    width = max(need, default=0) + extra_cols
    tables = torch.zeros(len(cases), width, dtype=torch.int32)
    slots, starts = [], [0]
    for i, case in enumerate(cases):
        tables[i, : need[i]] = torch.tensor(block_ids[i], dtype=torch.int32)
        for pos in range(case.history, case.seq_len):
            slots.append(block_ids[i][pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + case.q_len)
    masks = tuple(
        tree_mask(c.num_real, c.parent_ids) if c.parent_ids is not None else None for c in cases
    )
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor([c.seq_len for c in cases], dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_lens_host=tuple(c.q_len for c in cases),
        seq_lens_host=tuple(c.seq_len for c in cases),
        tree_masks=masks if any(m is not None for m in masks) else (),
    )
    return metadata, block_ids


def metadata_on(metadata: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """The same batch with its tensors on `device` (tree masks stay on the host, as built)."""
    return replace(
        metadata,
        query_start_loc=metadata.query_start_loc.to(device),
        seq_lens=metadata.seq_lens.to(device),
        block_tables=metadata.block_tables.to(device),
        slot_mapping=metadata.slot_mapping.to(device),
    )


def emulate_paged_attention(
    q,
    cache,
    qo_indptr,
    kv_indptr,
    kv_indices,
    last_page_len,
    *,
    page_size,
    sm_scale,
    causal,
    custom_mask,
):
    """FlashInfer's paged attention semantics, one request at a time, in float64."""
    out = torch.empty_like(q)
    group = q.shape[1] // cache.shape[-2]
    mask_offset = 0
    for i in range(len(qo_indptr) - 1):
        pages = kv_indices[kv_indptr[i] : kv_indptr[i + 1]].long()
        kv_len = (len(pages) - 1) * page_size + int(last_page_len[i])
        k = cache[pages, 0].reshape(-1, *cache.shape[-2:])[:kv_len].double()
        v = cache[pages, 1].reshape(-1, *cache.shape[-2:])[:kv_len].double()
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        q_len = rows.stop - rows.start
        if custom_mask is not None:
            mask = custom_mask[mask_offset : mask_offset + q_len * kv_len].view(q_len, kv_len)
            mask_offset += q_len * kv_len
        elif causal:
            mask = torch.arange(kv_len)[None, :] <= torch.arange(q_len)[:, None] + kv_len - q_len
        else:
            mask = torch.ones(q_len, kv_len, dtype=torch.bool)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[rows].double(), k) * sm_scale
        probs = scores.masked_fill(~mask.cpu(), float("-inf")).softmax(-1)
        out[rows] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


class FakeDecodeWrapper:
    """The tensor-core decode wrapper: q_len_per_req rows per request, causal within the
    request; in CUDA-graph mode a fixed batch size, a bounded page list and one q_len."""

    def __init__(
        self,
        workspace,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
    ):
        assert kv_layout == "NHD" and use_tensor_cores
        self.use_cuda_graph = use_cuda_graph
        if use_cuda_graph:
            self.fixed_batch = len(paged_kv_last_page_len_buffer)
            assert len(paged_kv_indptr_buffer) == self.fixed_batch + 1
            self.max_pages = len(paged_kv_indices_buffer)
        self.q_len = None
        self.num_plans = 0

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        pos_encoding_mode="NONE",
        q_data_type="float16",
        kv_data_type=None,
        sm_scale=None,
        q_len_per_req=1,
    ):
        assert pos_encoding_mode == "NONE" and indptr.dtype == indices.dtype == torch.int32
        batch = len(last_page_len)
        if self.use_cuda_graph:
            assert batch == self.fixed_batch, "cudagraph mode: the batch size is fixed"
            assert len(indices) <= self.max_pages, "page list larger than its buffer"
            assert self.q_len in (None, q_len_per_req), "q_len_per_req is frozen per wrapper"
        pages = indptr[1:] - indptr[:-1]
        kv_lens = (pages - 1) * page_size + last_page_len
        assert int(kv_lens.min()) >= q_len_per_req, "every request needs kv_len >= q_len"
        self.q_len = q_len_per_req
        self.num_plans += 1
        self.args = (torch.arange(batch + 1) * q_len_per_req, indptr, indices, last_page_len)
        self.kwargs = dict(page_size=page_size, sm_scale=sm_scale, causal=True, custom_mask=None)

    def run(self, q, paged_kv_cache):
        assert q.shape[0] == int(self.args[0][-1]), "q rows must be batch * q_len_per_req"
        return emulate_paged_attention(q, paged_kv_cache, *self.args, **self.kwargs)


class FakePrefillWrapper:
    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, backend="auto"):
        assert kv_layout == "NHD"
        self.num_plans = 0

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        *,
        custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        sm_scale=None,
        q_data_type="float16",
        kv_data_type=None,
    ):
        assert pos_encoding_mode == "NONE" and not (causal and custom_mask is not None)
        self.num_plans += 1
        self.args = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        self.kwargs = dict(
            page_size=page_size, sm_scale=sm_scale, causal=causal, custom_mask=custom_mask
        )

    def run(self, q, paged_kv_cache):
        return emulate_paged_attention(q, paged_kv_cache, *self.args, **self.kwargs)


def fake_flashinfer_module() -> SimpleNamespace:
    return SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=FakeDecodeWrapper,
        BatchPrefillWithPagedKVCacheWrapper=FakePrefillWrapper,
    )


def attention_stack(backend, tables: list[torch.Tensor], dtype: torch.dtype, scale: float):
    """A model_step made only of attention: token ids pick q/k/v rows, one backend call per
    layer (as many layers as the backend has caches)."""

    def step(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q_table, k_table, v_table = tables
        shift = (positions % 7)[:, None, None]  # positions matter, without a host sync
        # q + shift is rounded to bfloat16 on both sides, so both backends see the same q.
        q = (q_table[input_ids].float() + shift).to(torch.bfloat16).to(dtype)
        return torch.stack(
            [
                backend.forward(
                    layer,
                    q,
                    k_table[input_ids].to(dtype),
                    v_table[input_ids].to(dtype),
                    scale,
                )
                for layer in range(len(backend.kv_caches))
            ],
            dim=1,  # [n, layers, heads, head_dim]: rows first, as the graph runner gathers
        )

    return step


def graph_step_inputs(rng: random.Random, metadata: AttentionMetadata, vocab: int):
    """Host (input_ids, positions, gather rows) for a batch: random tokens at each request's
    new positions, and a random nonempty subset of rows to gather (in row order)."""
    num_tokens = metadata.num_tokens
    ids = torch.tensor([rng.randrange(vocab) for _ in range(num_tokens)], dtype=torch.int64)
    positions = torch.cat(
        [
            torch.arange(seq_len - q_len, seq_len)
            for q_len, seq_len in zip(metadata.query_lens_host, metadata.seq_lens_host)
        ]
    )
    rows = sorted(rng.sample(range(num_tokens), rng.randint(1, num_tokens)))
    return ids, positions, torch.tensor(rows, dtype=torch.int64)
