"""GGUF checkpoints (llama.cpp format) -> ModelArchConfig + HF-named float32 tensors.

Tensors are dequantised with `gguf.quants.dequantize` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
Q6_K, ...); on the quantized path, linear weights in a format the CPU kernels run keep their
blocks instead (kernels.cpu), the others are dequantised, and one log line counts both.
llama.cpp's converter permutes the rows of Llama Q/K projections so that each head's
two rotary halves are interleaved (ggml's "normal" RoPE pairs adjacent elements); our model
uses the HF rotate-half layout, so `unpermute_qk` undoes it. Qwen2, Qwen3, Phi-3 and Gemma 3
GGUFs use NeoX-style RoPE and are stored unpermuted.

Family facts the metadata leaves out, as llama.cpp fills them in (src/llama-model.cpp):
Gemma 3 slides every layer but each 6th (`sliding_window_pattern` where given), with RoPE base
10000 on the sliding layers, attention scale 1/sqrt(head_dim) (1/sqrt(hidden/heads) for the
62-layer 27B), embeddings times sqrt(hidden); its norm weights are stored as 1 + w (the
converter adds the 1). Phi-3 stores qkv and gate|up fused (`attn_qkv`, `ffn_up`); its 128k
variants' longrope factors (`rope_factors_long/short`) are refused. A Mistral GGUF is a `llama`
one (llama.cpp applies no sliding window to it either).
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

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "phi3", "gemma3")
# End-of-generation tokens besides the GGUF's eos, by their text: Qwen's instruct models end
# a turn with <|im_end|> (the eos) and plain text with <|endoftext|>; transformers'
# generation_config.json lists both.
_EXTRA_EOS_TOKENS = {
    "qwen2": ("<|endoftext|>",),
    "qwen3": ("<|endoftext|>",),
    "gemma3": ("<end_of_turn>",),
    "phi3": ("<|end|>",),
}
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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# Where an architecture names a layer tensor otherwise.
_ARCH_LAYER_NAMES = {
    "gemma3": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
# Gemma 3 facts llama.cpp hard-codes (module docstring).
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0


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
    head_dim = meta("attention.key_length") or hidden // num_heads
    _check_rope(arch, meta, tensors, head_dim)
    return ModelArchConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=meta("feed_forward_length"),
        num_layers=meta("block_count"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=meta("rope.freq_base", 10000.0),
        rope_scaling=_rope_scaling(meta("rope.scaling.type"), meta("rope.scaling.factor")),
        max_position_embeddings=meta("context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors,
        attention_out_bias="blk.0.attn_output.bias" in tensors,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_token_ids(reader, arch),
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        layer_windows=_layer_windows(arch, meta),
        **(_gemma3_fields(meta, hidden, num_heads, head_dim) if arch == "gemma3" else {}),
    )


def _check_rope(arch: str, meta, tensors: dict, head_dim: int) -> None:
    """Refuse RoPE variants the decoder lacks, naming them."""
    if "rope_factors_long.weight" in tensors or "rope_factors_short.weight" in tensors:
        raise ValueError(
            f"GGUF {arch}: longrope scaling (rope_factors_long/short, Phi-3 128k) is not "
            "supported; use a 4k variant"
        )
    rotary_dims = meta("rope.dimension_count")
    if rotary_dims not in (None, head_dim):
        raise ValueError(
            f"GGUF {arch}: partial RoPE ({rotary_dims} of {head_dim} dims) is not supported"
        )


def _layer_windows(arch: str, meta) -> tuple[int, ...]:
    """Per-layer sliding windows (ModelArchConfig.layer_windows) from `{arch}.attention.*`."""
    window = meta("attention.sliding_window")
    if not window or arch not in ("phi3", "gemma3"):
        return ()
    num_layers = meta("block_count")
    if arch == "phi3":
        return (int(window),) * num_layers
    pattern = meta("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, list):  # per layer: True = sliding
        return tuple(int(window) if sliding else 0 for sliding in pattern)
    return tuple(0 if (i + 1) % pattern == 0 else int(window) for i in range(num_layers))


def _gemma3_fields(meta, hidden: int, num_heads: int, head_dim: int) -> dict[str, Any]:
    big = meta("block_count") == 62  # the 27B: llama.cpp scales by hidden / heads there
    return dict(
        sandwich_norms=True,
        hidden_act="gelu_tanh",
        embedding_scale=hidden**0.5,
        query_pre_attn_scalar=hidden // num_heads if big else head_dim,
        local_rope_theta=GEMMA3_LOCAL_ROPE_THETA,
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


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    names = _LAYER_NAMES | _ARCH_LAYER_NAMES.get(arch, {})
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
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
    arch = reader.metadata.get("general.architecture")
    permuted = arch in _PERMUTED_ARCHS
    counts: Counter[tuple[str, str]] = Counter()  # (how it runs, GGUF type name)
    for tensor in reader.tensors:
        name = hf_name(tensor.name, arch)
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
    in_layer = (".self_attn." in name or ".mlp." in name) and not name.endswith("norm.weight")
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
