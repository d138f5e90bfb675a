"""The decoder stack as one native call on the CPU (kernels/cpu/csrc/stack.cpp).

The per-op path runs ~10 native ops a layer from Python; at batch 1 the interpreter, module
dispatch and tensor allocation around them cost about as much as the arithmetic. `NativeStack`
hands the whole stack to C++ in one call, which runs the same cores in the same order, so its
hidden states are bitwise those of the per-op path (tests/engine/models/test_native_stack.py).

It applies when every linear layer runs GGUF blocks on the native kernels (QuantLinear), the
model is float32 on the CPU, attention is the native `cpu` backend and no autograd is recording,
and every family runs there: the stack takes QK-norm (Qwen3, Gemma 3), Gemma's sandwich norms,
GeGLU, the sliding layers' own RoPE table and a sliding window per layer;
`NativeStack.build` returns None otherwise and the model keeps its per-op forward. It holds the
model's parameter tensors as they were when built: the model builds it on first use and again
after `load_weights`.
"""

from __future__ import annotations

import logging

import torch

from engine.models.linear import ACTIVATIONS, QuantLinear
from kernels.cpu import load_native
from kernels.cpu.paged_attention import CpuPagedBackend

logger = logging.getLogger(__name__)


def _runs(layer: QuantLinear) -> list[tuple]:
    """(blocks or None, format, first column, columns, tiles or None) per run of one format:
    the tiles where the layer's mode runs them, else the blocks as stored."""
    entries = []
    for run in layer.runs:
        tiles = layer.tiles_of(run)
        blocks = None if tiles is not None else run.blocks().data
        entries.append((blocks, run.qtype, run.columns.start, run.out_features, tiles))
    return entries


def _fits(model) -> bool:
    """Every linear layer on the native kernels with one activation mode, float32 CPU norms and
    RoPE tables, a head size the native RoPE takes."""
    linears = [
        getattr(part, name)
        for layer in model.layers
        for part, name in (
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        )
    ]
    floats = [model.norm.weight, model.rotary.cos] + [
        param for layer in model.layers for param in _norms(layer) if param is not None
    ]
    return (
        all(isinstance(linear, QuantLinear) for linear in linears)
        and len({linear.activations for linear in linears}) == 1
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in floats)
        and model.config.head_dim % 2 == 0
        and model.config.head_dim <= 1024
    )


class NativeStack:
    """The model's decoder layers and final norm, built once into a native DecoderStack."""

    def __init__(self, model, ops) -> None:
        c = model.config
        first = model.layers[0].self_attn.qkv_proj
        self.activations = first.activations
        self.scale = c.attention_scale
        # Seconds per phase of the layers (phase_names), summed over calls, when a benchmark
        # sets it to zeros(len(phase_names), float64); None: not timed.
        self.timings: torch.Tensor | None = None
        self.phase_names: list[str] = list(ops.DecoderStack.phases)
        self._stack = ops.DecoderStack(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.rms_norm_eps,
            model.rotary.cos.contiguous(),
            model.rotary.sin_signed.contiguous(),
            model.norm.weight.detach(),
            ACTIVATIONS[self.activations],
            gelu=c.hidden_act == "gelu_tanh",
            local_cos=None if model.rotary_local is None else model.rotary_local.cos.contiguous(),
            local_sin=None
            if model.rotary_local is None
            else model.rotary_local.sin_signed.contiguous(),
        )
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            _, _, q_norm, k_norm, pre_ffn, post_ffn = _norms(layer)
            self._stack.add_layer(
                layer.input_layernorm.weight.detach(),
                layer.post_attention_layernorm.weight.detach(),
                _runs(attn.qkv_proj),
                _bias(attn.qkv_proj),
                _runs(attn.o_proj),
                _bias(attn.o_proj),
                _runs(mlp.gate_up_proj),
                _runs(mlp.down_proj),
                c.window(i),
                q_norm,
                k_norm,
                pre_ffn,
                post_ffn,
                c.uses_local_rope(i),
            )

    @classmethod
    def build(cls, model) -> NativeStack | None:
        ops = load_native()
        if ops is None or not _fits(model):
            return None
        stack = cls(model, ops)
        down = [layer.mlp.down_proj for layer in model.layers]
        tiled = any(linear.tiles_of(run) is not None for linear in down for run in linear.runs)
        kernels = "packed tiles" if tiled else "the blocks as stored (AVX2/scalar kernels)"
        logger.info(
            "decoder: %d layers in one native call; linear layers on %s, %s activations",
            len(model.layers),
            kernels,
            stack.activations,
        )
        return stack

    @staticmethod
    def runs_on(backend, residual: torch.Tensor) -> bool:
        """Whether this call can take the native stack (else the per-op forward runs)."""
        return (
            isinstance(backend, CpuPagedBackend)
            and residual.dtype == torch.float32
            and not torch.is_grad_enabled()
        )

    def __call__(
        self,
        residual: torch.Tensor,
        positions: torch.Tensor,
        backend: CpuPagedBackend,
        num_layers: int,
    ) -> torch.Tensor:
        """residual [T, hidden] (the embeddings, overwritten) -> final-norm hidden [T, hidden]."""
        planned = backend.planned()
        return self._stack.forward(
            residual.contiguous(),
            positions.to(torch.int64).contiguous(),
            backend.kv_caches[:num_layers],
            planned.slots,
            planned.block_tables,
            planned.tokens,
            planned.mask,
            self.scale,
            num_layers,
            self.timings,
            planned.window_slots,
            planned.window_block_tables,
        )


def _bias(layer: QuantLinear) -> torch.Tensor | None:
    return None if layer.bias is None else layer.bias.detach().contiguous()


def _norms(layer) -> tuple[torch.Tensor | None, ...]:
    """(input, post-attention, q, k, pre-feedforward, post-feedforward) norm weights of a layer,
    None where the family has none."""

    def weight(module) -> torch.Tensor | None:
        return None if module is None else module.weight.detach()

    attn = layer.self_attn
    return (
        weight(layer.input_layernorm),
        weight(layer.post_attention_layernorm),
        weight(attn.q_norm),
        weight(attn.k_norm),
        weight(getattr(layer, "pre_feedforward_layernorm", None)),
        weight(getattr(layer, "post_feedforward_layernorm", None)),
    )
