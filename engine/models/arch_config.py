"""ModelArchConfig: the architecture facts a Llama-family decoder needs, from any checkpoint format.

HF `config.json` (transformers 4.x `rope_theta` + `rope_scaling`, or 5.x `rope_parameters`) maps
here through `from_hf_config`; the GGUF loader builds one from `llama.*` / `qwen2.*` metadata.
RoPE frequencies (default, linear, llama3) are computed here too, since they depend only on
config values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None = plain RoPE; else {"rope_type": "linear" | "llama3", "factor": ..., ...}
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama attention_bias)
    attention_out_bias: bool = False  # bias on o_proj too (only Llama's attention_bias=True)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_scaling type {rope_type!r} is not supported; supported: "
                f"{SUPPORTED_ROPE_TYPES}"
            )

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArchConfig:
        """From a transformers `config.json` dict (Llama, Qwen2, Mistral without sliding window)."""
        model_type = config.get("model_type", "llama")
        _check_supported(config, model_type)
        num_heads = config["num_attention_heads"]
        theta, scaling = _rope_from_hf(config)
        eos = config.get("eos_token_id")
        qkv_bias = model_type == "qwen2" or bool(config.get("attention_bias", False))
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            attention_out_bias=model_type == "llama" and bool(config.get("attention_bias", False)),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        )

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies [head_dim // 2], float32, after rope scaling."""
        cpu = torch.device("cpu")  # explicit: callers may sit inside a torch.device("meta") block
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=cpu).float()
        exponents = exponents / self.head_dim
        inv_freq = 1.0 / (self.rope_theta**exponents)
        scaling = self.rope_scaling or {}
        rope_type = scaling.get("rope_type", "default")
        if rope_type == "linear":
            return inv_freq / scaling["factor"]
        if rope_type == "llama3":
            return _llama3_inv_freq(inv_freq, scaling)
        return inv_freq


def _check_supported(config: dict[str, Any], model_type: str) -> None:
    problems = []
    if model_type not in SUPPORTED_MODEL_TYPES:
        problems.append(f"model_type {model_type!r} (supported: {SUPPORTED_MODEL_TYPES})")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config['hidden_act']!r} (only silu)")
    if config.get("mlp_bias"):
        problems.append("mlp_bias=true")
    if config.get("use_sliding_window") or (
        model_type == "mistral" and config.get("sliding_window") is not None
    ):
        problems.append("sliding-window attention")
    if problems:
        raise ValueError("unsupported model config: " + "; ".join(problems))


def _rope_from_hf(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) from either transformers 4.x or 5.x config keys."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or config.get("rope_theta", 10000.0)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    if rope_type == "default":
        return float(theta), None
    return float(theta), {"rope_type": rope_type, **params}


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency-dependent scaling: long wavelengths are divided by `factor`, short
    ones kept, and the band between them interpolated smoothly in 1/wavelength."""
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    original_len = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = original_len / low_freq_factor
    high_freq_wavelen = original_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    interpolated = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, interpolated, scaled)
