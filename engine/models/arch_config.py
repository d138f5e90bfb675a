"""ModelArchConfig: the architecture facts a Llama-family decoder needs, from any checkpoint format.

One decoder serves every family; a family is its differences from Llama as fields here:
Qwen2 (q/k/v bias), Qwen3 (`qk_norm`), Mistral and Phi-3 (`layer_windows`: a sliding window on
every layer; Phi-3's fused projections are a loading matter), Gemma 3 (`qk_norm`,
`sandwich_norms`, GeGLU `hidden_act`, `embedding_scale`, `query_pre_attn_scalar`, sliding
layers between global ones with their own `local_rope_theta`).

HF `config.json` (transformers 4.x `rope_theta` + `rope_scaling`, or 5.x `rope_parameters`) maps
here through `from_hf_config`; the GGUF loader builds one from `{arch}.*` metadata. RoPE
frequencies (default, linear, llama3) are computed here too, since they depend only on config
values. Whatever a family needs that we lack (longrope, logit soft-capping, ...) is refused
with a message naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# transformers' activation names -> ours (the MLP is act(gate) * up in every family).
HIDDEN_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# Layer types of transformers' `layer_types` -> does the layer use the sliding window.
_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


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
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3, Gemma 3)
    # Gemma 3: the attention output and the MLP output are normed before their residual add
    # (post_attention_layernorm, post_feedforward_layernorm; pre_feedforward_layernorm is the
    # MLP's input norm); else post_attention_layernorm is the MLP's input norm (Llama).
    sandwich_norms: bool = False
    hidden_act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    embedding_scale: float = 1.0  # Gemma: embeddings times sqrt(hidden)
    query_pre_attn_scalar: float | None = None  # attention scale 1/sqrt(this); None: head_dim
    # Per layer: a sliding window of that many positions (the query's own included), 0 = full
    # attention; () = every layer full.
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3), unscaled

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window(self, layer: int) -> int:
        """The sliding window of `layer` (0: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def uses_local_rope(self, layer: int) -> bool:
        return self.local_rope_theta is not None and self.window(layer) > 0

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
        if self.hidden_act not in HIDDEN_ACTS.values():
            raise ValueError(f"hidden_act {self.hidden_act!r}: supported {sorted(HIDDEN_ACTS)}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(
                f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers"
            )

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArchConfig:
        """From a transformers `config.json` dict (model types: SUPPORTED_MODEL_TYPES)."""
        model_type = config.get("model_type", "llama")
        _check_supported(config, model_type)
        num_heads = config["num_attention_heads"]
        theta, scaling, local_theta = _rope_from_hf(config)
        eos = config.get("eos_token_id")
        bias = bool(config.get("attention_bias", False))
        gemma = model_type == "gemma3_text"
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
            tie_word_embeddings=bool(config.get("tie_word_embeddings", gemma)),
            attention_bias=model_type == "qwen2" or bias,
            attention_out_bias=model_type != "qwen2" and bias,
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            sandwich_norms=gemma,
            hidden_act=HIDDEN_ACTS[_hidden_act(config)],
            embedding_scale=config["hidden_size"] ** 0.5 if gemma else 1.0,
            query_pre_attn_scalar=config.get("query_pre_attn_scalar") if gemma else None,
            layer_windows=_layer_windows(config, model_type),
            local_rope_theta=local_theta if gemma else None,
        )

    def inv_freq(self, local: bool = False) -> torch.Tensor:
        """RoPE inverse frequencies [head_dim // 2], float32, after rope scaling; `local`: the
        sliding layers' (local_rope_theta, no scaling)."""
        cpu = torch.device("cpu")  # explicit: callers may sit inside a torch.device("meta") block
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=cpu).float()
        exponents = exponents / self.head_dim
        theta = self.local_rope_theta if local else self.rope_theta
        inv_freq = 1.0 / (theta**exponents)
        scaling = {} if local else self.rope_scaling or {}
        rope_type = scaling.get("rope_type", "default")
        if rope_type == "linear":
            return inv_freq / scaling["factor"]
        if rope_type == "llama3":
            return _llama3_inv_freq(inv_freq, scaling)
        return inv_freq


def _hidden_act(config: dict[str, Any]) -> str:
    return config.get("hidden_activation") or config.get("hidden_act") or "silu"


def _check_supported(config: dict[str, Any], model_type: str) -> None:
    problems = []
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = " (a multimodal Gemma 3: give its text model)" if model_type == "gemma3" else ""
        problems.append(f"model_type {model_type!r}{hint} (supported: {SUPPORTED_MODEL_TYPES})")
    if _hidden_act(config) not in HIDDEN_ACTS:
        problems.append(f"hidden_act {_hidden_act(config)!r} (supported: {sorted(HIDDEN_ACTS)})")
    if config.get("mlp_bias"):
        problems.append("mlp_bias=true")
    if model_type in ("qwen2", "qwen3") and config.get("use_sliding_window"):
        problems.append("sliding-window attention of Qwen (use_sliding_window=true)")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key) is not None:
            problems.append(f"{key} (logit soft-capping)")
    if config.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention=true")
    if config.get("partial_rotary_factor", 1.0) != 1.0 or (
        (config.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0) != 1.0
    ):
        problems.append("partial_rotary_factor != 1 (partial RoPE)")
    unknown = set(config.get("layer_types") or ()) - set(_LAYER_TYPES)
    if unknown:
        problems.append(f"layer_types {sorted(unknown)} (supported: {sorted(_LAYER_TYPES)})")
    if problems:
        raise ValueError("unsupported model config: " + "; ".join(problems))


def _layer_windows(config: dict[str, Any], model_type: str) -> tuple[int, ...]:
    """Per-layer sliding windows: transformers' `layer_types` with `sliding_window` (Gemma 3),
    or `sliding_window` on every layer (Mistral, Phi-3); () when no layer slides."""
    window = config.get("sliding_window")
    if not window or model_type in ("qwen2", "qwen3"):
        return ()
    layer_types = config.get("layer_types")
    if layer_types is None and model_type == "gemma3_text":
        pattern = config.get("sliding_window_pattern", 6)  # every pattern-th layer is global
        num_layers = config["num_hidden_layers"]
        layer_types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    if layer_types is None:
        return (int(window),) * config["num_hidden_layers"]
    return tuple(int(window) if _LAYER_TYPES[t] else 0 for t in layer_types)


def _rope_from_hf(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float | None]:
    """(rope_theta, rope_scaling or None, the sliding layers' theta or None) from either
    transformers 4.x or 5.x config keys (5.x Gemma 3: parameters per layer type)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    local_theta = config.get("rope_local_base_freq")
    if "full_attention" in params or "sliding_attention" in params:
        local = dict(params.get("sliding_attention") or {})
        local_theta = local.get("rope_theta", local_theta)
        if local.get("rope_type", "default") != "default":
            raise ValueError(
                f"rope scaling {local['rope_type']!r} on sliding layers is not supported"
            )
        params = dict(params.get("full_attention") or {})
    theta = params.pop("rope_theta", None) or config.get("rope_theta", 10000.0)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    local_theta = None if local_theta is None else float(local_theta)
    if rope_type == "default":
        return float(theta), None, local_theta
    return float(theta), {"rope_type": rope_type, **params}, local_theta


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
