"""DraftRunner: a draft model's forward passes over the target request's paged-KV layout.

The draft cache mirrors the target's: same number of blocks, same block size, and the draft
K/V of a request's position p lives in the slot the target uses for p (block_ids[p //
block_size] * block_size + p % block_size). The target's block table doubles as the draft's,
so no second block manager is needed. The draft writes only slots of the request's own blocks:
catch-up rows are verified tokens (blocks shared through the prefix cache hold the same tokens
at the same positions, so they get the same values), and draft rows go to the slots the
scheduler reserved for this step's drafts (positions num_tokens - 1 .. num_tokens - 1 + k).

Two kinds of draft:
  * a separate model (`--draft-model PATH`: HF dir or GGUF) with its own paged cache; it must
    share the target's vocabulary (checked at load);
  * `self:N`: the target's first N layers + its final norm + lm_head (weights shared, no copy).
    Those layers compute exactly the K/V the target's first N layers compute, so the self-draft
    reads the target's own cache for the verified prefix (nothing to catch up) and writes only
    the reserved draft slots, which the target's verify pass overwrites before it reads them.

`--draft-vocab N` gives either kind a head over the first N token ids only (VocabPrefixHead):
the rest get -inf, so they are never drafted. BPE vocabularies number tokens roughly by merge
order, so the first ids are the frequent ones (on the Qwen pair's workloads the first 32k of
151,936 ids cover ~93% of tokens); the head is ~30% of the 0.5B draft's step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.models.arch_config import ModelArchConfig
from engine.models.linear import QuantLinear, linear
from engine.models.llama import LlamaForCausalLM
from kernels.attention import AttentionBackend, AttentionMetadata

SELF_DRAFT_PREFIX = "self:"
NUM_VOCAB_SAMPLES = 64  # token strings compared between target and draft tokenizers


@dataclass(frozen=True)
class DraftQuery:
    """One request's rows in a draft forward: token_ids at positions start, start + 1, ...
    (slots from block_ids); the logits of its last row are returned."""

    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]


class SelfDraft:
    """The target's first `num_layers` layers + final norm + lm_head, run on `backend`."""

    def __init__(self, target: LlamaForCausalLM, num_layers: int, backend: AttentionBackend):
        self.target = target
        self.num_layers = num_layers
        self.backend = backend

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.target(input_ids, positions, self.num_layers, self.backend)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden)


class VocabPrefixHead:
    """A causal LM's logits over its first `size` token ids, -inf for the others: the same
    head rows (the same bytes, the same kernels), so those logits equal the full head's."""

    def __init__(self, model: LlamaForCausalLM, size: int) -> None:
        vocab = model.config.vocab_size
        if not 1 <= size <= vocab:
            raise ValueError(f"--draft-vocab must be in 1..{vocab} (the vocabulary), got {size}")
        self.size, self.vocab_size = size, vocab
        self.head = _head_rows(model, size)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.new_full((hidden.shape[0], self.vocab_size), float("-inf"))
        logits[:, : self.size] = self.head(hidden).float()
        return logits


def _head_rows(model: LlamaForCausalLM, size: int) -> Any:
    """A callable hidden -> logits [N, size] over the first `size` rows of the model's head."""
    head = model.lm_head
    if isinstance(head, QuantLinear):
        parts, left = [], size
        for part in (part for run in head.runs for part in run.parts):
            if left > 0:
                parts.append(part.with_rows(part.data[:left]))
                left -= part.out_features
        bias = None if head.bias is None else head.bias[:size]
        rows = QuantLinear(parts, bias)
        rows.activations = head.activations  # the model's kernels' arithmetic
        rows.prepare()
        return rows
    weight = head.weight if head is not None else model.embed_tokens.weight
    bias = None if head is None or head.bias is None else head.bias[:size]
    return lambda hidden: linear(hidden, weight[:size], bias)


class DraftRunner:
    def __init__(
        self,
        model: Any,  # LlamaForCausalLM or SelfDraft: (ids, positions) -> hidden; compute_logits
        backend: AttentionBackend,
        arch: ModelArchConfig,
        block_size: int,
        device: torch.device,
        shares_target_cache: bool,
        head: VocabPrefixHead | None = None,  # None: the model's own compute_logits
    ) -> None:
        self.model = model
        self.backend = backend
        self.arch = arch
        self.block_size = block_size
        self.device = device
        self.shares_target_cache = shares_target_cache
        self.head = head

    @classmethod
    def from_target(
        cls, draft_model: str, target: Any, vocab: int = 0, weights: str = "auto"
    ) -> DraftRunner:
        """Build the draft named by `draft_model` next to `target` (the engine's ModelRunner);
        `vocab` > 0: its head over the first `vocab` token ids only; `weights`: SpecConfig's
        draft_weights (a separate draft's)."""
        if draft_model.startswith(SELF_DRAFT_PREFIX):
            num_layers = parse_self_draft(draft_model, target.arch.num_layers)
            model = SelfDraft(target.model, num_layers, target.backend)
            head = VocabPrefixHead(target.model, vocab) if vocab else None
            return cls(
                model, target.backend, target.arch, target.block_size, target.device, True, head
            )
        runner = cls._load_separate(draft_model, target, weights)
        runner.head = VocabPrefixHead(runner.model, vocab) if vocab else None
        return runner

    @classmethod
    def _load_separate(cls, draft_model: str, target: Any, weights: str) -> DraftRunner:
        from engine.models.loader import load_model, read_arch_config, resolve_model_path
        from kernels.registry import make_attention_backend

        path = resolve_model_path(draft_model)
        arch = read_arch_config(path)
        check_same_vocabulary(target.arch.vocab_size, arch.vocab_size, *_tokenizers(target, path))
        backend = make_attention_backend(
            target.config.device.attention_backend, target.device, dtype=target.dtype
        )
        weights = draft_weights(weights, target.config.model.weights, path, target)
        model, arch = load_model(path, target.dtype, target.device, backend, weights)
        backend.allocate(
            model.kv_cache_spec(
                target.num_blocks, target.block_size, target.kv_dtype, target.device
            )
        )
        return cls(model, backend, arch, target.block_size, target.device, False)

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size

    @property
    def max_positions(self) -> int:
        return self.arch.max_position_embeddings

    @torch.inference_mode()
    def logits(self, queries: Sequence[DraftQuery]) -> torch.Tensor:
        """One draft forward over all queries -> float32 logits [len(queries), vocab]."""
        input_ids, positions, metadata, last_rows = build_draft_input(
            queries, self.block_size, self.device
        )
        self.backend.plan(metadata)
        hidden = self.model(input_ids, positions)[last_rows]
        return self.head(hidden) if self.head is not None else self.model.compute_logits(hidden)


def draft_weights(setting: str, target_weights: str, path: Any, target: Any) -> str:
    """The --weights a separate draft loads with: `setting` unless auto; auto = the target's,
    with int8 activations where that runs a GGUF's blocks on the CPU kernels. The target
    verifies every draft, so the draft's arithmetic cannot change the output, and int8 does
    half int16's integer work (a 0.5B draft's 64-row catch-up: 0.61x the time, one row 0.94x)."""
    from engine.models.loader import resolve_weight_format

    if setting != "auto":
        return setting
    resolved = resolve_weight_format(target_weights, path, target.dtype, target.device)
    return "gguf-int8" if resolved in ("gguf", "gguf-int16", "gguf-f32") else target_weights


def build_draft_input(
    queries: Sequence[DraftQuery], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """Flat (input_ids [T], positions [T], metadata, last row of each query [N]).

    Query i attends causally to its own rows and to the request's history before `start`.
    """
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu_query = [0]
    seq_lens: list[int] = []
    for query in queries:
        end = query.start + len(query.token_ids)
        input_ids.extend(query.token_ids)
        positions.extend(range(query.start, end))
        slots.extend(
            query.block_ids[p // block_size] * block_size + p % block_size
            for p in range(query.start, end)
        )
        cu_query.append(cu_query[-1] + len(query.token_ids))
        seq_lens.append(end)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(cu_query, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=_block_table(queries).to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_lens_host=tuple(b - a for a, b in zip(cu_query, cu_query[1:])),
        seq_lens_host=tuple(seq_lens),
        tree_masks=(None,) * len(queries),
    )
    last_rows = [end - 1 for end in cu_query[1:]]
    return (
        torch.tensor(input_ids, dtype=torch.int64, device=device),
        torch.tensor(positions, dtype=torch.int64, device=device),
        metadata,
        torch.tensor(last_rows, dtype=torch.int64, device=device),
    )


def _block_table(queries: Sequence[DraftQuery]) -> torch.Tensor:
    """[num_queries, max_blocks] int32, 0-padded."""
    table = torch.zeros(len(queries), max(len(q.block_ids) for q in queries), dtype=torch.int32)
    for i, query in enumerate(queries):
        table[i, : len(query.block_ids)] = torch.tensor(list(query.block_ids), dtype=torch.int32)
    return table


def parse_self_draft(draft_model: str, num_target_layers: int) -> int:
    """'self:N' -> N, checked against the target's depth."""
    text = draft_model.removeprefix(SELF_DRAFT_PREFIX).strip()
    if not text.isdigit() or not 1 <= int(text) <= num_target_layers:
        raise ValueError(
            f"draft_model {draft_model!r}: a self-draft is 'self:N' with N the number of the "
            f"target's leading layers to run, 1 <= N <= {num_target_layers}"
        )
    return int(text)


def check_same_vocabulary(
    target_vocab_size: int, draft_vocab_size: int, target_tokenizer: Any, draft_tokenizer: Any
) -> None:
    """Refuse a draft whose token ids mean something else than the target's.

    Vocabulary sizes must match; when both models ship a tokenizer, their sizes and the token
    strings of NUM_VOCAB_SAMPLES ids spread over the vocabulary must match too.
    """
    if target_vocab_size != draft_vocab_size:
        raise ValueError(
            f"draft model vocabulary ({draft_vocab_size} tokens) differs from the target's "
            f"({target_vocab_size}); a draft model must share the target's tokenizer"
        )
    if target_tokenizer is None or draft_tokenizer is None:
        return
    sizes = (target_tokenizer.vocab_size, draft_tokenizer.vocab_size)
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"draft tokenizer has {sizes[1]} tokens, the target's {sizes[0]}; a draft model "
            "must share the target's tokenizer"
        )
    step = max(1, sizes[0] // NUM_VOCAB_SAMPLES)
    ids = sorted({*range(0, sizes[0], step), sizes[0] - 1})
    target_strings = target_tokenizer.convert_ids_to_tokens(ids)
    draft_strings = draft_tokenizer.convert_ids_to_tokens(ids)
    for token_id, ours, theirs in zip(ids, target_strings, draft_strings):
        if ours != theirs:
            raise ValueError(
                f"draft tokenizer differs from the target's: token {token_id} is {theirs!r} "
                f"in the draft, {ours!r} in the target; a draft model must share the "
                "target's tokenizer"
            )


def _tokenizers(target: Any, draft_path: Any) -> tuple[Any, Any]:
    from engine.models.tokenizer import Tokenizer

    return Tokenizer.from_path(target.model_path), Tokenizer.from_path(draft_path)
