"""GGUF models on the quantized path (weights=gguf): linear layers keep the file's blocks and
run the native CPU kernels; logits agree with the dequantised float32 path of the same file;
mixed formats in a fused projection work; and `weights` resolves as documented."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.models import loader
from engine.models.linear import Linear, QuantEmbedding, QuantLinear
from engine.models.loader import load_model, resolve_weight_format
from kernels.reference import ReferenceBackend
from tests.engine.models.test_gguf_loader import (
    gguf_name,
    llamacpp_permute,
    write_gguf,
    write_tiny_metadata,
)
from tests.kernels.cpu.quant_cases import k_quant_blocks

Q = gguf.GGMLQuantizationType


@pytest.fixture(autouse=True)
def needs_native():
    from kernels.cpu import native_available

    if not native_available():
        pytest.skip("the native CPU kernels are unavailable here (see the logged warning)")


def load(path, weights):
    model, _ = load_model(path, torch.float32, "cpu", ReferenceBackend(), weights=weights)
    return model


# Logit tolerance against the dequantised float32 path, relative to the largest logit: float32
# activations differ by summation order only; the default int16 ones also by their rounding
# (1/32639 of a group's largest value, ~1e-4 of the logits here).
TOLERANCE = {"gguf-f32": 1e-5, "gguf": 1e-3}


def assert_paths_agree(path, helpers, vocab_size):
    """Same effective weights on both paths: logits differ by summation order (and the int16
    activations' rounding) only."""
    sequences = helpers.schedule_sequences(vocab_size)
    dense = helpers.paged_logits(load(path, "float32"), sequences)
    for weights, tolerance in TOLERANCE.items():
        quantized = helpers.paged_logits(load(path, weights), sequences)
        for rid in sequences:
            scale = dense[rid].abs().max()
            torch.testing.assert_close(quantized[rid], dense[rid], rtol=0, atol=tolerance * scale)
            assert scale > 0


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
def test_quantized_layers_match_the_float_path(tmp_path, models_helpers, qtype, tied):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=tied)
    path = write_gguf(tmp_path / "m.gguf", hf_dir, qtype=qtype)
    model = load(path, "gguf")
    assert isinstance(model.layers[1].self_attn.qkv_proj, QuantLinear)
    assert isinstance(model.layers[0].mlp.down_proj, QuantLinear)
    assert isinstance(model.lm_head, QuantLinear)  # the tied head runs the embedding's blocks
    dense = load(path, "float32")
    assert isinstance(dense.layers[1].self_attn.qkv_proj, Linear)
    assert (dense.lm_head is None) == tied
    # The embedding keeps its blocks; every row it looks up equals the float table's.
    assert isinstance(model.embed_tokens, QuantEmbedding)
    all_ids = torch.arange(models_helpers.TINY["vocab_size"])
    assert torch.equal(model.embed_tokens(all_ids), dense.embed_tokens.weight)
    assert_paths_agree(path, models_helpers, models_helpers.TINY["vocab_size"])


# q: Q4_K, k: Q5_K, v: Q6_K (one fused projection, three formats); o: F16 (not a kernel format:
# dequantised); MLP: gate Q8_0 + up F16 (mixed float/quantized: the layer stays float).
MIXED_TYPES = {
    "q_proj": Q.Q4_K,
    "k_proj": Q.Q5_K,
    "v_proj": Q.Q6_K,
    "o_proj": Q.F16,
    "gate_proj": Q.Q8_0,
    "up_proj": Q.F16,
    "down_proj": Q.Q4_0,
    "lm_head": Q.Q6_K,
}


def write_mixed_gguf(path, hf_dir):
    config = json.loads((hf_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(path, "llama")
    write_tiny_metadata(writer, hidden=256, heads=4, kv_heads=2, ff=512)
    writer.add_vocab_size(config["vocab_size"])
    rng = np.random.default_rng(0)
    for name, tensor in load_file(hf_dir / "model.safetensors").items():
        array = tensor.float().numpy()
        if ".q_proj." in name or ".k_proj." in name:
            array = llamacpp_permute(array, 4 if ".q_proj." in name else 2)
        kind = next((t for key, t in MIXED_TYPES.items() if key in name), Q.F32)
        if array.ndim == 1 or name == "model.embed_tokens.weight":
            kind = Q.F32
        if kind in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # gguf cannot quantise these: random blocks
            data = k_quant_blocks(rng, kind, *array.shape)
        else:
            data = gguf.quants.quantize(array, kind)
        writer.add_tensor(gguf_name(name), data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_mixed_formats_and_float_parts(tmp_path, models_helpers):
    hf_dir, _ = models_helpers.build_hf_model(
        tmp_path / "hf", hidden_size=256, intermediate_size=512, tie_word_embeddings=False
    )
    path = write_mixed_gguf(tmp_path / "mixed.gguf", hf_dir)
    model = load(path, "gguf")
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantLinear) and "Q4_K+Q5_K+Q6_K" in repr(qkv)
    assert isinstance(model.layers[0].self_attn.o_proj, Linear)  # F16: dequantised
    assert isinstance(model.layers[0].mlp.gate_up_proj, Linear)  # Q8_0 + F16 rows: float
    assert isinstance(model.layers[0].mlp.down_proj, QuantLinear)
    assert isinstance(model.lm_head, QuantLinear)
    assert_paths_agree(path, models_helpers, models_helpers.TINY["vocab_size"])


def test_weights_setting_resolves_as_documented(tmp_path, tiny_model_dir, monkeypatch):
    hf_dir = tiny_model_dir
    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"GGUF")  # only the suffix matters here
    f32, bf16 = torch.float32, torch.bfloat16
    assert resolve_weight_format("auto", gguf_path, f32, "cpu") == "gguf"
    assert resolve_weight_format("gguf", gguf_path, f32, "cpu") == "gguf"
    for setting in ("gguf-f32", "gguf-int16", "gguf-int8"):
        assert resolve_weight_format(setting, gguf_path, f32, "cpu") == setting
    assert resolve_weight_format("float32", gguf_path, f32, "cpu") == "float32"
    assert resolve_weight_format("auto", hf_dir, f32, "cpu") == "float32"
    assert resolve_weight_format("auto", gguf_path, bf16, "cpu") == "float32"
    assert resolve_weight_format("auto", gguf_path, f32, "cuda") == "float32"
    for bad in [(hf_dir, f32, "cpu"), (gguf_path, bf16, "cpu"), (gguf_path, f32, "cuda")]:
        with pytest.raises(ValueError, match="weights=gguf runs a .gguf file"):
            resolve_weight_format("gguf", *bad)
    with pytest.raises(ValueError, match="weights must be one of"):
        resolve_weight_format("int8", gguf_path, f32, "cpu")
    monkeypatch.setattr(loader, "native_available", lambda: False)  # the build failed
    assert resolve_weight_format("auto", gguf_path, f32, "cpu") == "float32"
    assert resolve_weight_format("gguf", gguf_path, f32, "cpu") == "float32"


@pytest.mark.parametrize("weights", ["gguf", "gguf-f32", "gguf-int8"])
def test_a_request_is_bitwise_the_same_alone_and_batched(tmp_path, models_helpers, weights):
    """End to end on the quantized path (each activation mode): batching never changes
    a request's logits (what keeps speculative decoding token-identical to plain decoding)."""
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    model = load(write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q4_0), weights)
    prompt, other, tokens = list(range(3, 12)), list(range(40, 46)), (5, 6, 7)
    # One driver at a time: drivers share the model's backend and its KV cache.
    alone = models_helpers.PagedDriver(model, num_blocks=32, block_size=4)
    expected = [alone.step({"a": prompt})["a"]]
    expected += [alone.step({"a": [token]})["a"] for token in tokens]
    batched = models_helpers.PagedDriver(model, num_blocks=32, block_size=4)
    got = [batched.step({"b": other, "a": prompt})["a"]]
    got += [batched.step({"b": [token, 9, 10], "a": [token]})["a"] for token in tokens]
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(want, have), step


@pytest.mark.parametrize(
    "weights, layer_type, kind",
    [
        ("gguf", QuantLinear, "gguf-int16:"),
        ("gguf-f32", QuantLinear, "gguf-float32:"),
        ("gguf-int8", QuantLinear, "gguf-int8:"),
        ("float32", Linear, "dense"),
    ],
)
def test_the_engine_setting_reaches_the_loaded_model(
    tmp_path, models_helpers, weights, layer_type, kind
):
    """`--weights` is honoured by the engine (it once stopped at the config)."""
    from engine.config import EngineConfig
    from engine.runner.model_runner import ModelRunner

    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=True)
    path = write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q8_0)
    config = EngineConfig.from_flat({"model": str(path), "weights": weights, "num_kv_blocks": 8})
    runner = ModelRunner(config)
    assert type(runner.model.layers[0].mlp.down_proj) is layer_type
    assert runner.weight_format.startswith(kind)  # the cost-model cache key tells them apart
    if layer_type is QuantLinear:
        want = {"gguf": "int16", "gguf-f32": "float32", "gguf-int8": "int8"}[weights]
        assert {m.activations for m in runner.model.modules() if isinstance(m, QuantLinear)} == {
            want
        }


@pytest.mark.parametrize("tied", [False, True])
def test_k_quant_model_matches_the_float_path(tmp_path, models_helpers, tied):
    """A whole model in llama.cpp's Q4_K_M mix (Q4_K, and Q6_K for v, down and the head):
    every linear layer and the embedding keep their blocks; logits agree with the dequantised
    float32 path within each activation mode's tolerance."""
    from tests import kquants

    hf_dir, _ = models_helpers.build_hf_model(
        tmp_path / "hf", tie_word_embeddings=tied, **models_helpers.KQUANT_DIMS
    )
    path = write_gguf(tmp_path / "k.gguf", hf_dir, qtype=kquants.q4_k_m)
    model = load(path, "gguf")
    formats = {
        run.type_name for m in model.modules() if isinstance(m, QuantLinear) for run in m.runs
    }
    assert formats == {"Q4_K", "Q6_K"} and isinstance(model.embed_tokens, QuantEmbedding)
    assert_paths_agree(path, models_helpers, models_helpers.TINY["vocab_size"])
