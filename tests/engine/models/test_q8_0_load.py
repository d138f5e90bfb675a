"""`weights=q8_0`: a safetensors model quantized to Q8_0 as it loads runs exactly as the Q8_0
GGUF of the same checkpoint does (same blocks, so bitwise the same logits), for tied and untied
heads; and the setting refuses what it cannot do."""

from __future__ import annotations

import gguf
import pytest
import torch

from engine.models.linear import QuantEmbedding, QuantLinear
from engine.models.loader import resolve_weight_format
from tests.engine.models.test_gguf_loader import write_gguf
from tests.engine.models.test_quantized_gguf import load

Q = gguf.GGMLQuantizationType


@pytest.fixture(autouse=True)
def needs_native():
    from kernels.cpu import native_available

    if not native_available():
        pytest.skip("the native CPU kernels are unavailable here (see the logged warning)")


@pytest.mark.parametrize("tied", [False, True])
def test_q8_0_at_load_equals_the_q8_0_gguf(tmp_path, models_helpers, tied):
    hf_dir, _ = models_helpers.build_hf_model(tmp_path / "hf", tie_word_embeddings=tied)
    at_load = load(hf_dir, "q8_0")
    from_file = load(write_gguf(tmp_path / "m.gguf", hf_dir, qtype=Q.Q8_0), "gguf")
    layers = [m for m in at_load.modules() if isinstance(m, QuantLinear)]
    assert isinstance(at_load.lm_head, QuantLinear) and isinstance(
        at_load.embed_tokens, QuantEmbedding
    )
    assert len(layers) == 1 + 4 * models_helpers.TINY["num_hidden_layers"]  # qkv, o, gate_up, down
    assert all(run.type_name == "Q8_0" for m in layers for run in m.runs)
    sequences = models_helpers.schedule_sequences(models_helpers.TINY["vocab_size"])
    got = models_helpers.paged_logits(at_load, sequences)
    want = models_helpers.paged_logits(from_file, sequences)
    dense = models_helpers.paged_logits(load(hf_dir, "float32"), sequences)
    for rid in sequences:
        assert torch.equal(got[rid], want[rid])
        assert not torch.equal(got[rid], dense[rid])  # quantized: not the float weights
        torch.testing.assert_close(got[rid], dense[rid], rtol=0, atol=0.05 * dense[rid].abs().max())


def test_q8_0_setting_resolves_as_documented(tmp_path, tiny_model_dir, monkeypatch):
    from engine.models import loader

    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"GGUF")
    f32 = torch.float32
    assert resolve_weight_format("q8_0", tiny_model_dir, f32, "cpu") == "q8_0"
    for bad in [(gguf_path, f32, "cpu"), (tiny_model_dir, torch.bfloat16, "cpu")]:
        with pytest.raises(ValueError, match="weights=q8_0 quantizes a safetensors model"):
            resolve_weight_format("q8_0", *bad)
    monkeypatch.setattr(loader, "native_available", lambda: False)  # the build failed
    assert resolve_weight_format("q8_0", tiny_model_dir, f32, "cpu") == "float32"
