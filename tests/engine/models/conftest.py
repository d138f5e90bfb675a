"""A minimal paged driver for model tests: hand-built AttentionMetadata over shuffled
(non-contiguous) blocks, so the model runs through the same paged path the engine uses."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from kernels.attention import AttentionMetadata
from tests.conftest import TINY_CONFIG


class PagedDriver:
    """Feeds token chunks of several requests through `model` one step at a time."""

    def __init__(self, model, num_blocks: int = 256, block_size: int = 4, seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        model.backend.allocate(model.kv_cache_spec(num_blocks, block_size, dtype, device))
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.block_ids: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def _slots(self, request_id: str, num_new: int) -> list[int]:
        blocks = self.block_ids.setdefault(request_id, [])
        start = self.lengths.get(request_id, 0)
        end = start + num_new
        while len(blocks) * self.block_size < end:
            blocks.append(self.free_blocks.pop())
        self.lengths[request_id] = end
        return [
            blocks[p // self.block_size] * self.block_size + p % self.block_size
            for p in range(start, end)
        ]

    def step(
        self, chunks: dict[str, list[int]], tree_masks: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """chunks: request_id -> new token ids; tree_masks: request_id -> [n, n] bool mask over
        its new tokens (default causal). Returns request_id -> float32 logits [n, vocab]."""
        device = self.model.norm.weight.device
        starts = {rid: self.lengths.get(rid, 0) for rid in chunks}
        slots = [s for rid, ids in chunks.items() for s in self._slots(rid, len(ids))]
        query_lens = [len(ids) for ids in chunks.values()]
        seq_lens = [self.lengths[rid] for rid in chunks]
        width = max(len(self.block_ids[rid]) for rid in chunks)
        tables = [self.block_ids[rid] + [0] * (width - len(self.block_ids[rid])) for rid in chunks]
        metadata = AttentionMetadata(
            query_start_loc=torch.tensor(
                [0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=device
            ),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_lens_host=tuple(query_lens),
            seq_lens_host=tuple(seq_lens),
            tree_masks=tuple((tree_masks or {}).get(rid) for rid in chunks),
        )
        input_ids = torch.tensor([t for ids in chunks.values() for t in ids], device=device)
        positions = torch.tensor(
            [p for rid, ids in chunks.items() for p in range(starts[rid], starts[rid] + len(ids))],
            device=device,
        )
        self.model.backend.plan(metadata)
        with torch.inference_mode():
            logits = self.model.compute_logits(self.model(input_ids, positions))
        return dict(zip(chunks, logits.split(query_lens), strict=True))

    def greedy(self, request_id: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """Prefill the whole prompt, then decode one token per step."""
        logits = self.step({request_id: prompt_ids})[request_id]
        output = [int(logits[-1].argmax())]
        while len(output) < max_new_tokens:
            logits = self.step({request_id: output[-1:]})[request_id]
            output.append(int(logits[-1].argmax()))
        return output


# The shared tiny config, with a shorter context and transformers' default tying.
TINY = {k: v for k, v in TINY_CONFIG.items() if k != "tie_word_embeddings"} | {
    "max_position_embeddings": 256
}


# The smallest widths the K-quants take (rows of 256 values): head_dim 64, 4 heads, 2 KV heads.
KQUANT_DIMS = {"hidden_size": 256, "intermediate_size": 512}


# Each family's tiny config beside TINY: explicit head sizes (Qwen3 and Gemma default to large
# ones), sliding windows shorter than SCHEDULE's 13-token sequences so the windows bite,
# Gemma's global and sliding layers with different RoPE bases and a query_pre_attn_scalar
# unlike head_dim, Phi-3's ids inside the tiny vocabulary.
FAMILY_OVERRIDES = {
    "llama": {},
    "qwen2": {},
    "qwen3": dict(head_dim=16),
    "mistral": dict(head_dim=16, sliding_window=5),
    "phi3": dict(sliding_window=6, pad_token_id=0),
    "gemma3_text": dict(
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        },
        pad_token_id=0,
    ),
}


def hf_classes(model_type: str):
    """(config class, model class) of transformers for `model_type`."""
    import transformers as t

    return {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM),
        "mistral": (t.MistralConfig, t.MistralForCausalLM),
        "phi3": (t.Phi3Config, t.Phi3ForCausalLM),
        "gemma3_text": (t.Gemma3TextConfig, t.Gemma3ForCausalLM),
    }[model_type]


def build_hf_model(path, model_type: str = "llama", seed: int = 0, **overrides):
    """Save a tiny random HF model whose weights are large enough (std 1/sqrt(fan_in), random
    norm scales and biases) that attention is far from uniform, so RoPE, masking or bias
    mistakes move the logits visibly. Returns (path, the HF model)."""
    config_class, model_class = hf_classes(model_type)
    torch.manual_seed(seed)
    config = {**TINY, **FAMILY_OVERRIDES[model_type], **overrides}
    model = model_class(config_class(**config)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                offset = 0 if model_type == "gemma3_text" else 1  # Gemma scales by 1 + w
                param.copy_(offset + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.3 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def reference_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """HF logits of every position of one sequence, float32 [len, vocab]."""
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


# Steps of a two-request schedule: request a prefills 9 tokens alone, then decodes while b
# prefills in two chunks (6 + 5), then both decode twice. Block size 4 makes chunks straddle
# blocks, and the driver's shuffled free list makes each request's blocks non-contiguous.
SCHEDULE = [{"a": 9}, {"a": 1, "b": 6}, {"b": 5, "a": 1}, {"a": 1, "b": 1}, {"b": 1, "a": 1}]


def paged_logits(
    model, sequences: dict[str, list[int]], schedule=SCHEDULE
) -> dict[str, torch.Tensor]:
    """Teacher-forced logits of every position of each sequence, through the paged path."""
    driver = PagedDriver(model, num_blocks=32, block_size=4)
    fed = {rid: 0 for rid in sequences}
    pieces: dict[str, list[torch.Tensor]] = {rid: [] for rid in sequences}
    for step in schedule:
        chunks = {rid: sequences[rid][fed[rid] : fed[rid] + n] for rid, n in step.items()}
        for rid, logits in driver.step(chunks).items():
            pieces[rid].append(logits)
            fed[rid] += len(chunks[rid])
    return {rid: torch.cat(p) for rid, p in pieces.items()}


def schedule_sequences(vocab_size: int, seed: int = 1, schedule=SCHEDULE) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths: dict[str, int] = {}
    for step in schedule:
        for rid, n in step.items():
            lengths[rid] = lengths.get(rid, 0) + n
    return {
        rid: torch.randint(0, vocab_size, (n,), generator=gen).tolist()
        for rid, n in lengths.items()
    }


@pytest.fixture
def models_helpers():
    """The helpers above, for test modules (importlib mode cannot import conftest directly)."""
    import types

    return types.SimpleNamespace(
        build_hf_model=build_hf_model,
        reference_logits=reference_logits,
        paged_logits=paged_logits,
        schedule_sequences=schedule_sequences,
        PagedDriver=PagedDriver,
        TINY=TINY,
        KQUANT_DIMS=KQUANT_DIMS,
        FAMILIES=tuple(FAMILY_OVERRIDES),
    )
