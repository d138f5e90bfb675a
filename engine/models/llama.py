"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3) over a flattened
ragged batch; each family's differences are ModelArchConfig fields, not subclasses.

`forward(input_ids [T], positions [T]) -> hidden [T, hidden]`: the T tokens of a step, requests
laid end to end. Attention goes through an AttentionBackend, which the runner `plan`s before
calling forward; each layer hands it q/k/v and gets the attended values back, so this module
never sees block tables or masks.

Numerics follow transformers' Llama (engine/models/layers.py: RMSNorm, RoPE; SwiGLU MLP) and the
families' differences as transformers computes them (Gemma's (1 + w) norms arrive as 1 + w from
the loaders). Q/K/V and gate/up are fused into one Linear each (fewer, larger matmuls on CPU);
`load_weights` maps HF parameter names onto the fused slices (or whole, for Phi-3's fused
checkpoints). A layer hands on its output as a delta: the next
layer's norm adds it to the residual stream (one fused op on CPU).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

import torch
from torch import nn

from engine.models.arch_config import ModelArchConfig
from engine.models.layers import RMSNorm, Rotary
from engine.models.linear import Linear, QuantEmbedding, install_quantized, linear
from engine.models.native_stack import NativeStack
from kernels.attention import AttentionBackend, KVCacheSpec
from kernels.cpu import QuantizedWeight
from kernels.fused import gelu_tanh_mul, silu_mul

__all__ = ["LlamaForCausalLM", "ModelArchConfig"]

# Extra weight name the GGUF loader emits for llama.cpp's `rope_freqs` tensor (per-frequency
# divisors that encode Llama-3 rope scaling in GGUF files).
ROPE_FREQ_FACTORS = "model.rope_freq_factors"


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelArchConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.attention_scale
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.qkv_proj = Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = Linear(
            config.num_heads * config.head_dim, config.hidden_size, bias=config.attention_out_bias
        )

    def forward(
        self, x: torch.Tensor, rotary: Rotary, positions: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        # Q and K are adjacent in the fused output: rotate them in one go, in place.
        num_qk = self.num_heads + self.num_kv_heads
        qk = qkv[:, : num_qk * self.head_dim].view(num_tokens, num_qk, self.head_dim)
        if self.q_norm is not None:
            self._norm_heads_(qk)
        rotary.rotate_(qk, positions)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, num_qk * self.head_dim :].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = backend.forward(self.layer_idx, q, k, v, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def _norm_heads_(self, qk: torch.Tensor) -> None:
        """QK-norm in place: each query head by q_norm, each key head by k_norm ([T, H + Hkv, D])."""
        for norm, heads in (
            (self.q_norm, slice(0, self.num_heads)),
            (self.k_norm, slice(self.num_heads, None)),
        ):
            rows = qk[:, heads].reshape(-1, self.head_dim)
            qk[:, heads] = norm(rows)[1].view(qk.shape[0], -1, self.head_dim)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelArchConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_mul = silu_mul if config.hidden_act == "silu" else gelu_tanh_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelArchConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.sandwich_norms = config.sandwich_norms
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        residual: torch.Tensor,
        delta: torch.Tensor | None,
        rotary: Rotary,
        positions: torch.Tensor,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, the previous layer's output) -> the same pair after this layer."""
        residual, h = self.input_layernorm(residual, delta)
        attended = self.self_attn(h, rotary, positions, backend)
        if self.sandwich_norms:  # Gemma: norm(attn) and norm(mlp) are what the residual adds
            attended = self.post_attention_layernorm(attended)[1]
            residual, h = self.pre_feedforward_layernorm(residual, attended)
            return residual, self.post_feedforward_layernorm(self.mlp(h))[1]
        residual, h = self.post_attention_layernorm(residual, attended)
        return residual, self.mlp(h)


class LlamaForCausalLM(nn.Module):
    # Run the layers as one native call where it applies (engine/models/native_stack.py);
    # False keeps the per-op forward (the benchmarks' baseline, the tests' reference).
    native_stack_enabled = True

    def __init__(self, config: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self._native_stack: NativeStack | None = None
        self._native_stack_built = False
        # Its own table: nn.Embedding's normal_ init, run on the meta device (loader.py builds
        # there, then loads over every weight), imports torch._dynamo, ~1.4 s of start-up.
        table = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config)
        # The sliding layers' own RoPE table (Gemma 3), or None: every layer uses `rotary`.
        self.rotary_local = Rotary(config, local=True) if config.local_rope_theta else None
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        num_layers: int | None = None,
        backend: AttentionBackend | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> final-norm hidden states [T, hidden].

        Positions must be < config.max_position_embeddings (the RoPE table's length).
        `num_layers` runs only the first layers (a self-draft), on `backend` if given."""
        backend = backend or self.backend
        residual, delta = self.embed_tokens(input_ids), None
        if self.config.embedding_scale != 1.0:
            residual = residual * torch.tensor(self.config.embedding_scale, dtype=residual.dtype)
        # (range slicing: slicing the ModuleList would build a new module every step)
        depth = len(range(len(self.layers))[:num_layers])
        stack = self.native_stack()
        if stack is not None and NativeStack.runs_on(backend, residual):
            return stack(residual, positions, backend, depth)
        for i, layer in enumerate(itertools.islice(self.layers, depth)):
            rotary = self.rotary_local if self.config.uses_local_rope(i) else self.rotary
            residual, delta = layer(residual, delta, rotary, positions, backend)
        return self.norm(residual, delta)[1]

    def reset_rotary(self) -> None:
        """Recompute the RoPE tables (after materialising the model from the meta device)."""
        for rotary in (self.rotary, self.rotary_local):
            if rotary is not None:
                rotary.reset()

    def native_stack(self) -> NativeStack | None:
        """The native decoder stack, built on first use (None where it does not apply)."""
        if not self.native_stack_enabled:
            return None
        stack = self._native_stack
        if not self._native_stack_built or (
            stack is not None and stack.activations != self._activations()
        ):
            self._native_stack = stack = NativeStack.build(self)
            self._native_stack_built = True
        return stack

    def _activations(self) -> str:
        return getattr(self.layers[0].self_attn.qkv_proj, "activations", "float32")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] (only the rows that need sampling) -> float32 logits [N, vocab]."""
        if self.lm_head is None:
            return linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    def kv_cache_spec(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> KVCacheSpec:
        c = self.config
        return KVCacheSpec(
            c.num_layers,
            num_blocks,
            block_size,
            c.num_kv_heads,
            c.head_dim,
            dtype,
            torch.device(device),
            c.layer_windows,
        )

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]) -> None:
        """Copy HF-named tensors (`model.layers.0.self_attn.q_proj.weight`, ...) into the model,
        casting to each parameter's dtype/device. Raises ValueError on unknown or missing names.

        A linear weight given as a QuantizedWeight (GGUF blocks, CPU float32 only) makes its
        layer a QuantLinear once all of its rows are quantized (see install_quantized). So does
        `lm_head.weight` for tied embeddings; the embedding itself becomes a QuantEmbedding."""
        self._native_stack_built = False  # rebuilt from the new weights on next use
        loaded: set[str] = set()
        quantized: dict[tuple[nn.Module, str], list] = defaultdict(list)
        for hf_name, tensor in weights:
            if hf_name == ROPE_FREQ_FACTORS:
                self.rotary.reset(tensor)
                continue
            if isinstance(tensor, QuantizedWeight):
                if hf_name == "model.embed_tokens.weight":
                    self.embed_tokens = QuantEmbedding(tensor)
                else:
                    owner, attr, rows = self._linear_for(hf_name)
                    quantized[(owner, attr)].append((rows, tensor))
                loaded.add(hf_name)
                continue
            if hf_name.endswith("rotary_emb.inv_freq") or (
                hf_name == "lm_head.weight" and self.lm_head is None
            ):
                continue  # recomputed / tied to the embedding
            target, rows = self._param_for(hf_name)
            if rows is not None:
                target = target[rows]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{hf_name}: expected shape {tuple(target.shape)}, got {tuple(tensor.shape)}"
                )
            target.copy_(tensor)
            loaded.add(hf_name)
        for (owner, attr), parts in quantized.items():
            layer = getattr(owner, attr)
            shape = (self.config.vocab_size, self.config.hidden_size)  # a tied head
            if layer is not None:
                shape = (layer.out_features, layer.in_features)
            setattr(owner, attr, install_quantized(layer, parts, shape))
        fused = any(".qkv_proj." in name for name in loaded)
        missing = sorted(set(self.expected_weight_names(fused)) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")

    def expected_weight_names(self, fused: bool = False) -> list[str]:
        """The HF names `load_weights` must see for this config; `fused`: the checkpoint stores
        qkv_proj and gate_up_proj whole (Phi-3)."""
        c = self.config
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if self.lm_head is not None:
            names.append("lm_head.weight")
        params = ["qkv_proj"] if fused else ["q_proj", "k_proj", "v_proj"]
        suffixes = [f"self_attn.{p}.weight" for p in [*params, "o_proj"]]
        if c.attention_bias:
            suffixes += [f"self_attn.{p}.bias" for p in params]
        if c.attention_out_bias:
            suffixes.append("self_attn.o_proj.bias")
        if c.qk_norm:
            suffixes += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        mlp = ["gate_up_proj"] if fused else ["gate_proj", "up_proj"]
        suffixes += [f"mlp.{p}.weight" for p in [*mlp, "down_proj"]]
        suffixes += [f"{norm}.weight" for norm in _layer_norm_names(c)]
        return names + [f"model.layers.{i}.{s}" for i in range(c.num_layers) for s in suffixes]

    def _param_for(self, hf_name: str) -> tuple[torch.Tensor, slice | None]:
        """HF name -> (our parameter, row slice of it for fused projections or None)."""
        if hf_name == "lm_head.weight":
            return self.lm_head.weight, None
        parts = hf_name.split(".")
        if parts[0] != "model":
            raise ValueError(f"unexpected weight {hf_name!r}")
        if parts[1] in ("embed_tokens", "norm"):
            return getattr(self, parts[1]).weight, None
        layer = self._layer_for(hf_name)
        if len(parts) == 5 and parts[3] in _layer_norm_names(self.config):
            return getattr(layer, parts[3]).weight, None
        if len(parts) == 6 and parts[4] in ("q_norm", "k_norm") and self.config.qk_norm:
            return getattr(layer.self_attn, parts[4]).weight, None
        owner, attr, rows = self._linear_for(hf_name)
        param = getattr(getattr(owner, attr, None), parts[-1], None)
        if not isinstance(param, torch.Tensor):
            raise ValueError(f"unexpected weight {hf_name!r}")
        return param, rows

    def _layer_for(self, hf_name: str) -> LlamaDecoderLayer:
        parts = hf_name.split(".")
        if parts[1] != "layers" or len(parts) not in (5, 6) or not parts[2].isdigit():
            raise ValueError(f"unexpected weight {hf_name!r}")
        if int(parts[2]) >= len(self.layers):
            raise ValueError(f"{hf_name!r}: the config has {len(self.layers)} layers")
        return self.layers[int(parts[2])]

    def _linear_for(self, hf_name: str) -> tuple[nn.Module, str, slice | None]:
        """HF name of a linear weight/bias -> (owning module, attribute of the linear layer in
        it, row slice for fused projections or None)."""
        if hf_name == "lm_head.weight":
            return self, "lm_head", None
        c, parts = self.config, hf_name.split(".")
        if parts[0] != "model" or parts[1] != "layers" or len(parts) != 6:
            raise ValueError(f"unexpected linear weight {hf_name!r}")
        module_name, proj = parts[3], parts[4]
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        fused = {
            "q_proj": ("qkv_proj", slice(0, q_size)),
            "k_proj": ("qkv_proj", slice(q_size, q_size + kv_size)),
            "v_proj": ("qkv_proj", slice(q_size + kv_size, q_size + 2 * kv_size)),
            "gate_proj": ("gate_up_proj", slice(0, c.intermediate_size)),
            "up_proj": ("gate_up_proj", slice(c.intermediate_size, 2 * c.intermediate_size)),
        }
        owner = getattr(self._layer_for(hf_name), module_name, None)
        attr, rows = fused.get(proj, (proj, None))
        if not isinstance(getattr(owner, attr, None), nn.Module):
            raise ValueError(f"unexpected weight {hf_name!r}")
        return owner, attr, rows


def _layer_norm_names(config: ModelArchConfig) -> tuple[str, ...]:
    if config.sandwich_norms:
        return (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
    return ("input_layernorm", "post_attention_layernorm")
