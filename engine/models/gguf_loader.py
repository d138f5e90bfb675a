"""GGUF checkpoints (llama.cpp format) -> ModelArchConfig + HF-named float32 tensors.

Tensors are dequantised with `gguf.quants.dequantize` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
Q6_K, ...); on the quantized path, linear weights in a format the CPU kernels run keep their
blocks instead (kernels.cpu), the others are dequantised, and one log line counts both.
llama.cpp's converter permutes the rows of Llama Q/K projections so that each head's
two rotary halves are interleaved (ggml's "normal" RoPE pairs adjacent elements); our model
uses the HF rotate-half layout, so `unpermute_qk` undoes it. Qwen2 GGUFs use NeoX-style RoPE
and are stored unpermuted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.models.arch_config import ModelArchConfig
from engine.models.gguf_file import GGUFFile, GGUFTensor, read_gguf
from engine.models.llama import ROPE_FREQ_FACTORS
from kernels.cpu import QuantizedWeight, is_native_type

logger = logging.getLogger(__name__)

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2")
# End-of-generation tokens besides the GGUF's eos, by their text: Qwen's instruct models end
# a turn with <|im_end|> (the eos) and plain text with <|endoftext|>; transformers'
# generation_config.json lists both.
_EXTRA_EOS_TOKENS = {"qwen2": ("<|endoftext|>",)}
# Architectures whose Q/K rows llama.cpp's converter permutes.
_PERMUTED_ARCHS = ("llama",)

EMBEDDING = "model.embed_tokens.weight"
_GLOBAL_NAMES = {
    "token_embd.weight": EMBEDDING,
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": ROPE_FREQ_FACTORS,
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def open_gguf(path: Path) -> GGUFFile:
    """Metadata and memory-mapped tensors of a GGUF file (engine.models.gguf_file)."""
    return read_gguf(path)


def gguf_config(reader: GGUFFile) -> ModelArchConfig:
    """ModelArchConfig from `{arch}.*` metadata and the tensor list."""
    metadata = reader.metadata
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_GGUF_ARCHS}"
        )
    tensors = {t.name: t for t in reader.tensors}

    def meta(key: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{key}", default)

    hidden, num_heads = meta("embedding_length"), meta("attention.head_count")
    num_kv_heads = meta("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):
        raise ValueError("GGUF with per-layer KV head counts is not supported")
    vocab_size = meta("vocab_size") or tensors["token_embd.weight"].shape[0]
    return ModelArchConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=meta("feed_forward_length"),
        num_layers=meta("block_count"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=meta("attention.key_length") or hidden // num_heads,
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=meta("rope.freq_base", 10000.0),
        rope_scaling=_rope_scaling(meta("rope.scaling.type"), meta("rope.scaling.factor")),
        max_position_embeddings=meta("context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        attention_out_bias="blk.0.attn_output.bias" in tensors,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_token_ids(reader, arch),
    )


def _eos_token_ids(reader: GGUFFile, arch: str) -> tuple[int, ...]:
    """The GGUF's eos, then its eot (end of turn), then the architecture's extra ones."""
    ids = [reader.metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot")]
    extra = reader.find_strings("tokenizer.ggml.tokens", _EXTRA_EOS_TOKENS.get(arch, ()))
    ids += sorted(extra.values())
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def _rope_scaling(kind: str | None, factor: float | None) -> dict[str, Any] | None:
    # Llama-3 scaling is stored as the `rope_freqs` tensor, not as metadata.
    if kind in (None, "none") or not factor or factor == 1.0:
        return None
    if kind != "linear":
        raise ValueError(f"GGUF rope scaling {kind!r} is not supported (only linear)")
    return {"rope_type": "linear", "factor": float(factor)}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's Q/K permutation. Within each head the converter reorders rows
    from (half, i) to (i, half), i < head_dim/2; reshaping as (heads, head_dim/2, 2) and
    swapping the last two axes restores (half, i). Works on weights [rows, cols] and biases."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def iter_gguf_weights(
    reader: GGUFFile, config: ModelArchConfig, quantized: bool = False
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """Yield (HF name, float32 tensor) for every tensor in the file, Q/K unpermuted.

    quantized=True: linear weights and the embedding stored in a format the CPU kernels run
    (kernels.cpu) come as QuantizedWeight (the file's blocks, rows unpermuted) instead; a tied
    model's embedding blocks come once more as `lm_head.weight`."""
    permuted = reader.metadata.get("general.architecture") in _PERMUTED_ARCHS
    counts: Counter[tuple[str, str]] = Counter()  # (how it runs, GGUF type name)
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        keep_blocks = quantized and is_native_type(tensor.ggml_type) and len(tensor.shape) == 2
        counts[_how_it_runs(name, tensor, keep_blocks)] += 1
        if keep_blocks and (is_linear_weight(name) or name == EMBEDDING):
            blocks = _blocks(tensor)
            yield name, _unpermuted(blocks, name, config, permuted)
            if name == EMBEDDING and config.tie_word_embeddings:
                yield "lm_head.weight", blocks  # the same bytes, not a copy
            continue
        yield name, _unpermuted(_dequantised(tensor), name, config, permuted)
    summary = "; ".join(f"{how} {kind} x{n}" for (how, kind), n in sorted(counts.items()))
    logger.info("%s tensors: %s", reader.metadata.get("general.name", "GGUF"), summary)


def _how_it_runs(name: str, tensor: GGUFTensor, keep_blocks: bool) -> tuple[str, str]:
    """('native', type) for blocks the kernels run; ('float32', type) for the rest, where
    'TYPE linear' is a linear weight dequantised because the kernels lack its format."""
    from gguf.constants import GGMLQuantizationType

    kind = GGMLQuantizationType(tensor.ggml_type).name
    if keep_blocks and (is_linear_weight(name) or name == EMBEDDING):
        return "native", kind
    return "float32", f"{kind} linear" if is_linear_weight(name) else kind


def is_linear_weight(name: str) -> bool:
    in_layer = ".self_attn." in name or ".mlp." in name
    return name.endswith(".weight") and (in_layer or name == "lm_head.weight")


def _dequantised(tensor: GGUFTensor) -> torch.Tensor:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    array = dequantize(tensor.data, GGMLQuantizationType(tensor.ggml_type))
    if array.size != int(np.prod(tensor.shape)):
        raise ValueError(f"{tensor.name}: dequantised {array.shape}, expected {tensor.shape}")
    array = array.reshape(tensor.shape)
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _blocks(tensor: GGUFTensor) -> QuantizedWeight:
    """The tensor's rows of blocks: a view of the memory map, not a copy (the kernels pack what
    they read; GGUFFile.release_pages hands the file's pages back after)."""
    return QuantizedWeight(tensor.ggml_type, torch.from_numpy(tensor.data), tensor.shape[1])


def _unpermuted(
    weight: torch.Tensor | QuantizedWeight, name: str, config: ModelArchConfig, permuted: bool
) -> torch.Tensor | QuantizedWeight:
    """Undo the Q/K row permutation on a float tensor or on a QuantizedWeight's block rows
    (a row permutation moves whole rows, so blocks are permuted as they are)."""
    heads = {".self_attn.q_proj.": config.num_heads, ".self_attn.k_proj.": config.num_kv_heads}
    for key, num_heads in heads.items():
        if permuted and key in name:
            if isinstance(weight, QuantizedWeight):
                return weight.with_rows(unpermute_qk(weight.data, num_heads))
            return unpermute_qk(weight, num_heads)
    return weight
