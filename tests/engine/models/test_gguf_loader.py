"""GGUF files written here from tiny HF models, the way llama.cpp's converter writes them
(Q/K rows permuted for Llama, norms kept F32), load back to the original weights and logits."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.models.gguf_loader import hf_name, iter_gguf_weights, open_gguf, unpermute_qk
from engine.models.loader import load_model, read_arch_config
from engine.models.tokenizer import Tokenizer
from kernels.reference import ReferenceBackend
from tests import kquants

Q = gguf.GGMLQuantizationType
_HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",  # Phi-3
    "mlp.gate_up_proj": "ffn_up",  # Phi-3: gate|up in one tensor
}
_GEMMA3_NORMS = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# transformers model_type -> the GGUF architecture llama.cpp's converter writes.
GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma3_text": "gemma3",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(name: str, arch: str = "llama") -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    names = _HF_TO_GGUF | (_GEMMA3_NORMS if arch == "gemma3" else {})
    return f"blk.{match[1]}.{names[match[2]]}.{match[3]}"


def llamacpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation: per head, rows (half, i) -> (i, half)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(path, hf_dir, qtype=Q.F32, arch="llama", drop=(), extra_tensors=None):
    """Convert the tiny HF model in hf_dir; 2-D weights as `qtype` (a type, or a function of
    the HF tensor name giving one; K-quants through tests/kquants.py), 1-D tensors F32.
    Gemma 3's norms are written as 1 + w, as llama.cpp's converter does."""
    import json

    config = json.loads((hf_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, arch)
    write_family_metadata(writer, config, arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    rope = config["rope_parameters"]
    writer.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    tensors = {k: v.float().numpy() for k, v in load_file(hf_dir / "model.safetensors").items()}
    tensors.update(extra_tensors or {})
    for name, array in tensors.items():
        if name in drop:
            continue
        if arch == "llama" and ".q_proj." in name:
            array = llamacpp_permute(array, heads)
        elif arch == "llama" and ".k_proj." in name:
            array = llamacpp_permute(array, kv_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1
        kind = (qtype(name) if callable(qtype) else qtype) if array.ndim == 2 else Q.F32
        quantizer = kquants.quantize if kind in kquants.TYPES else gguf.quants.quantize
        data = quantizer(array, kind)
        writer.add_tensor(
            gguf_name(name, arch) if name.startswith(("model.", "lm_head")) else name,
            data,
            raw_dtype=kind,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_family_metadata(writer, config: dict, arch: str) -> None:
    """What llama.cpp's converter writes beyond the Llama keys: head size, sliding window (the
    Gemma 3 pattern as per-layer flags)."""
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch in ("phi3", "gemma3") and config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
    if arch == "gemma3":
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])


def load_ours(path):
    model, _ = load_model(path, torch.float32, "cpu", ReferenceBackend())
    return model


def assert_logits_match(model, hf_model, helpers, rtol=1e-4, atol=1e-4):
    sequences = helpers.schedule_sequences(helpers.TINY["vocab_size"])
    ours = helpers.paged_logits(model, sequences)
    for rid, ids in sequences.items():
        torch.testing.assert_close(
            ours[rid], helpers.reference_logits(hf_model, ids), rtol=rtol, atol=atol
        )


@pytest.mark.parametrize("tied", [False, True])
def test_f32_gguf_matches_transformers(tmp_path, models_helpers, tied):
    hf_dir, hf_model = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=tied)
    path = write_gguf(tmp_path / "m.gguf", hf_dir)
    config = read_arch_config(path)
    assert config.tie_word_embeddings == tied
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (
        4,
        2,
        16,
        256,
    )
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1
    assert_logits_match(load_ours(path), hf_model, models_helpers)


# Gemma's GGUF scale is fixed by llama.cpp's rule (1/sqrt(head_dim)), so its HF twin uses that.
GGUF_FAMILY_OVERRIDES = {"gemma3_text": dict(query_pre_attn_scalar=16)}


@pytest.mark.parametrize("model_type", ["mistral", "qwen3", "phi3", "gemma3_text"])
def test_family_f32_gguf_matches_transformers(tmp_path, models_helpers, model_type):
    """Each family written as llama.cpp's converter writes it loads to transformers' logits."""
    overrides = GGUF_FAMILY_OVERRIDES.get(model_type, {})
    hf_dir, hf_model = models_helpers.build_hf_model(tmp_path / "hf", model_type, **overrides)
    path = write_gguf(tmp_path / "m.gguf", hf_dir, arch=GGUF_ARCH[model_type])
    ours, theirs = read_arch_config(path), read_arch_config(hf_dir)
    family = ("qk_norm", "sandwich_norms", "hidden_act", "local_rope_theta", "head_dim")
    family += ("query_pre_attn_scalar", "tie_word_embeddings", "attention_bias")
    for field in family:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.embedding_scale == pytest.approx(theirs.embedding_scale)
    model = load_ours(path)
    if model_type == "mistral":  # a Mistral GGUF is a llama one: no window (as in llama.cpp)
        assert ours.layer_windows == ()
        full = models_helpers.build_hf_model(tmp_path / "full", model_type, sliding_window=None)
        hf_model = full[1]
    else:
        assert ours.layer_windows == theirs.layer_windows
    assert_logits_match(model, hf_model, models_helpers)


def test_phi3_longrope_gguf_is_refused(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", "phi3")
    extra = {"rope_factors_long.weight": np.ones(8, dtype=np.float32)}
    path = write_gguf(tmp_path / "m.gguf", hf_dir, arch="phi3", extra_tensors=extra)
    with pytest.raises(ValueError, match="longrope"):
        read_arch_config(path)


def test_qwen2_gguf_is_not_unpermuted(tmp_path, models_helpers):
    """qwen2 GGUFs keep HF row order (NeoX RoPE); their q/k biases load as-is."""
    hf_dir, hf_model = models_helpers.build_hf_model(
        tmp_path / "hf", "qwen2", tie_word_embeddings=False
    )
    path = write_gguf(tmp_path / "q.gguf", hf_dir, arch="qwen2")
    assert read_arch_config(path).attention_bias
    assert_logits_match(load_ours(path), hf_model, models_helpers)


def test_rope_freqs_tensor_encodes_llama3_scaling(tmp_path, models_helpers):
    """llama.cpp stores Llama-3 rope scaling as `rope_freqs` = default / scaled frequencies."""
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    scaling["original_max_position_embeddings"] = 16
    hf_dir, hf_model = models_helpers.build_hf_model(tmp_path / "hf", rope_scaling=scaling)
    scaled = read_arch_config(hf_dir).inv_freq()
    default = 1.0 / 10000.0 ** (torch.arange(0, 16, 2).float() / 16)
    factors = {"rope_freqs.weight": (default / scaled).numpy()}
    path = write_gguf(tmp_path / "r.gguf", hf_dir, extra_tensors=factors)
    assert read_arch_config(path).rope_scaling is None
    assert_logits_match(load_ours(path), hf_model, models_helpers)


# Per storage type: bound on |loaded - original| / max|original| of each tensor, and on the
# logits' absolute error (None: 4-bit noise on random weights swamps logits, weights suffice).
QUANT_TOLERANCE = {
    Q.F16: (1e-3, 0.02),
    Q.BF16: (1e-2, 0.2),
    Q.Q8_0: (1e-2, 0.3),
    Q.Q4_0: (0.15, None),
    Q.Q4_1: (0.1, None),
}


@pytest.mark.parametrize("qtype", list(QUANT_TOLERANCE), ids=lambda q: q.name)
def test_quantised_gguf_weights_dequantise_to_originals(tmp_path, models_helpers, qtype):
    weight_tolerance, logit_tolerance = QUANT_TOLERANCE[qtype]
    hf_dir, hf_model = models_helpers.build_hf_model(tmp_path / "hf")
    path = write_gguf(tmp_path / "m.gguf", hf_dir, qtype=qtype)
    loaded = dict(iter_gguf_weights(open_gguf(path), read_arch_config(path)))
    original = {k: v.float() for k, v in load_file(hf_dir / "model.safetensors").items()}
    assert loaded.keys() == original.keys()
    for name, weight in original.items():
        error = (loaded[name] - weight).abs().max() / weight.abs().max()
        assert error <= weight_tolerance, (name, float(error))
    if logit_tolerance is not None:
        model = load_ours(path)
        assert_logits_match(model, hf_model, models_helpers, rtol=0.0, atol=logit_tolerance)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quant_tensors_load_with_the_right_shape(tmp_path, models_helpers, qtype):
    """gguf cannot quantise K-quants, so write random blocks (finite scales) and check each
    loads as the library's own dequantisation, reshaped to [out, in] and Q/K-unpermuted."""
    hf_dir, _ = models_helpers.build_hf_model(
        tmp_path / "hf", hidden_size=256, intermediate_size=512
    )
    writer = gguf.GGUFWriter(tmp_path / "k.gguf", "llama")
    write_tiny_metadata(writer, hidden=256, heads=4, kv_heads=2, ff=512)
    rng = np.random.default_rng(0)
    expected = {}
    for name, tensor in load_file(hf_dir / "model.safetensors").items():
        if tensor.ndim == 1 or name == "model.embed_tokens.weight":
            data, kind = tensor.numpy(), Q.F32
        else:
            data, kind = random_k_blocks(rng, tensor.shape, qtype), qtype
        writer.add_tensor(gguf_name(name), data, raw_dtype=kind)
        expected[name] = torch.from_numpy(
            gguf.quants.dequantize(data, kind).reshape(tensor.shape).copy()
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = dict(
        iter_gguf_weights(open_gguf(tmp_path / "k.gguf"), read_arch_config(tmp_path / "k.gguf"))
    )
    for name, weight in expected.items():
        if ".q_proj." in name or ".k_proj." in name:
            weight = unpermute_qk(weight, 4 if ".q_proj." in name else 2)
        assert torch.equal(loaded[name], weight), name


def write_tiny_metadata(writer, hidden, heads, kv_heads, ff):
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)


def random_k_blocks(rng, shape, qtype) -> np.ndarray:
    """Random K-quant bytes for a [rows, cols] tensor with every fp16 scale set to 0.01."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    blocks = rng.integers(0, 256, size=(rows, cols // block_elems, block_bytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d, dmin lead the block
        blocks[..., 0:2] = scale
        blocks[..., 2:4] = scale
    else:  # Q6_K: d ends the block
        blocks[..., -2:] = scale
    return blocks.reshape(rows, -1)


def test_unpermute_inverts_llamacpp_permutation():
    weight = torch.arange(6 * 8 * 5, dtype=torch.float32).reshape(6 * 8, 5)
    for heads in (1, 2, 3, 6):
        permuted = torch.from_numpy(llamacpp_permute(weight.numpy(), heads))
        assert not torch.equal(permuted, weight)
        assert torch.equal(unpermute_qk(permuted, heads), weight)
    bias = torch.arange(24, dtype=torch.float32)
    assert torch.equal(unpermute_qk(torch.from_numpy(llamacpp_permute(bias.numpy(), 3)), 3), bias)


def test_gguf_names_map_to_hf_names():
    assert hf_name("blk.7.attn_q.bias") == "model.layers.7.self_attn.q_proj.bias"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError, match="unexpected GGUF tensor"):
        hf_name("blk.0.ffn_gate_exps.weight")


def test_gguf_without_tokenizer_metadata_has_no_tokenizer(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf")
    path = write_gguf(tmp_path / "m.gguf", hf_dir)
    assert Tokenizer.from_path(path) is None
