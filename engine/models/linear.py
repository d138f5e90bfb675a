"""Linear layers for CPU decode and speculative verify: float32 and GGUF-quantized.

`Linear`: float weights; few-row float32 matmuls on CPU take the W @ x^T path below.
`QuantLinear`: the GGUF's blocks as stored, run by the native kernels in kernels/cpu.
`QuantEmbedding`: a token embedding kept as blocks, only the looked-up rows dequantised.

Measured on the 2-core AMD EPYC dev machine (torch 2.13, MKL, one thread; SmolLM2's 30 layers
of weights, 424 MB): `F.linear(x, W)` with x [M, in] takes 38 ms at M=1, 66 ms at M=2 and
76 ms at M=3, while the same product written as `(W @ x.T).T` takes 26, 25 and 39 ms; from
M=8 on F.linear is faster again. MKL's x @ W^T path for a handful of rows is far from
memory-bound; W @ x^T streams W once. A single row is duplicated because the matrix-vector
path is the slow one. GPUs and other dtypes keep F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.weight_runs import WeightRun, runs_of
from kernels.cpu import (
    ACTIVATIONS,
    QuantizedWeight,
    dequantize,
    float_tiles_run,
    load_native,
    pack_runs,
    qlinear,
)

# The activation arithmetic of the GGUF path unless a setting asks for another (kernels/cpu):
# int16 runs every format on the integer tiles at the memory-bandwidth bound with greedy tokens
# equal to transformers' up to near-ties (docs/benchmarks.md §6); float32 keeps exact float
# arithmetic (gguf-f32), int8 is llama.cpp's (gguf-int8).
DEFAULT_ACTIVATIONS = "int16"

# Largest row count that takes the W @ x^T path (crossover measured between 4 and 8).
MAX_ROWS_TRANSPOSED = 5


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same result as F.linear(x, weight, bias) for x [M, in], weight [out, in]."""
    num_rows = x.shape[0]
    if (
        x.device.type != "cpu"
        or x.dtype != torch.float32
        or x.dim() != 2
        or num_rows > MAX_ROWS_TRANSPOSED
    ):
        return F.linear(x, weight, bias)
    padded = torch.cat((x, x)) if num_rows == 1 else x
    out = (weight @ padded.T).T[:num_rows].contiguous()
    return out if bias is None else out + bias


class Linear(nn.Linear):
    """nn.Linear (same parameters and state-dict names) computed with `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class QuantLinear(nn.Module):
    """A linear layer whose weight stays as GGUF blocks (kernels.cpu), float32 on the CPU.

    `parts` cover the output rows in order; a fused projection (q|k|v, gate|up) may store its
    parts in different formats, so each run of one format (weight_runs.WeightRun) is its own
    kernel call writing its column slice of the output. Every output row depends on its own
    input row only (the kernels' batch invariance). `activations` is the kernels' arithmetic:
    float32, int16 or int8 (each row quantized per group of 32; set_activations).
    """

    activations = DEFAULT_ACTIVATIONS

    def __init__(self, parts: list[QuantizedWeight], bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.runs = runs_of(parts)
        self.in_features = self.runs[0].in_features
        self.out_features = sum(run.out_features for run in self.runs)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32, device=x.device)
        ops = load_native()  # cached; None only if the build failed (the loader then avoids us)
        act = ACTIVATIONS[self.activations]
        for run in self.runs:
            bias = None if self.bias is None else self.bias[run.columns]
            target = out if len(self.runs) == 1 else out[:, run.columns]
            if ops is None:
                qlinear(x, run.blocks(), bias, out=target, act=self.activations)
                continue
            tiles = self.tiles_of(run)
            blocks = None if tiles is not None else run.blocks().data
            ops.qlinear_out(x, blocks, run.qtype, bias, target, 0, act, tiles)
        return out

    def tiles_of(self, run: WeightRun) -> torch.Tensor | None:
        """The run's packed tiles where this activation mode runs them, else None (the blocks
        as stored run)."""
        return run.tiles() if self.runs_tiles(run) else None

    def runs_tiles(self, run: WeightRun) -> bool:
        """Whether this mode runs `run` as tiles: integer modes always, float32 on the
        AVX-512 formats."""
        return self.activations != "float32" or float_tiles_run(run.parts[0], run.out_features)

    def prepare(self) -> None:
        """Make what the kernels will read in this mode now (packing), not at the first step."""
        for run in self.runs:
            if self.tiles_of(run) is None:
                run.blocks()

    def extra_repr(self) -> str:
        formats = "+".join(run.type_name for run in self.runs)
        act = "" if self.activations == "float32" else f", {self.activations} activations"
        return f"in_features={self.in_features}, out_features={self.out_features}, {formats}{act}"


class QuantEmbedding(nn.Module):
    """nn.Embedding over a GGUF's blocks: a lookup dequantises just the rows it reads, to the
    values the float table would hold (the kernels' dequantize is bit-exact to gguf's). Saves
    the vocab x hidden float32 table: 545 MB for Qwen2.5-0.5B, 933 MB for 1.5B."""

    def __init__(self, weight: QuantizedWeight) -> None:
        super().__init__()
        self.qtype = weight.qtype
        self.embedding_dim = weight.in_features
        self.type_name = weight.type_name
        self.register_buffer("blocks", weight.data, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.blocks.index_select(0, input_ids.reshape(-1))
        values = dequantize(QuantizedWeight(self.qtype, rows, self.embedding_dim))
        return values.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.blocks.shape[0]}, {self.embedding_dim}, {self.type_name}"


def install_quantized(
    linear_layer: nn.Module | None,
    parts: list[tuple[slice | None, QuantizedWeight]],
    shape: tuple[int, int],
) -> nn.Module:
    """The layer that should run `parts` (row slice of the layer, or None for all rows) of a
    weight of `shape` [out, in]. Raises ValueError when a part does not fit its rows.

    If they cover every output row, a QuantLinear carrying the float layer's bias; otherwise
    (some rows arrived as float tensors) the quantized rows are dequantised into the float
    layer, which stays. `linear_layer` None: a new head with no float twin (tied embeddings).
    """
    ordered = sorted(parts, key=lambda p: 0 if p[0] is None else p[0].start)
    for row_slice, weight in ordered:
        rows = range(shape[0])[row_slice or slice(None)]
        if weight.shape != (len(rows), shape[1]):
            raise ValueError(f"quantized weight {weight.shape} does not fit rows {row_slice}")
    if sum(weight.out_features for _, weight in ordered) == shape[0]:
        bias = None if linear_layer is None else linear_layer.bias
        return QuantLinear([weight for _, weight in ordered], bias)
    for row_slice, weight in ordered:
        target = linear_layer.weight if row_slice is None else linear_layer.weight[row_slice]
        target.copy_(dequantize(weight))
    return linear_layer


def set_activations(model: nn.Module, activations: str) -> None:
    """Every QuantLinear of `model` runs `activations` (float32, int16 or int8; kernels.cpu)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {sorted(ACTIVATIONS)}, got {activations!r}")
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.activations = activations


def prepare_kernels(model: nn.Module) -> None:
    """Make what every QuantLinear's mode reads now (load time) rather than at the first step:
    the tiles of every run that runs tiles, in one native call (pack_runs, in parallel over
    the kernels' threads), and the blocks of the others."""
    layers = [module for module in model.modules() if isinstance(module, QuantLinear)]
    to_pack = [run for layer in layers for run in layer.runs if layer.runs_tiles(run)]
    packed = pack_runs([run.packed_parts() for run in to_pack])
    if packed is not None:
        for run, tiles in zip(to_pack, packed, strict=True):
            run.set_tiles(tiles)
    for layer in layers:
        layer.prepare()  # the blocks of the runs left (and tiles, without the native library)


def weight_format(model: nn.Module) -> str:
    """`gguf-<activations>:<kernel build id>` when any layer runs GGUF blocks on the native
    kernels, else `dense`: what step times depend on besides the model's shape (the cost-model
    cache key)."""
    layers = [module for module in model.modules() if isinstance(module, QuantLinear)]
    if not layers:
        return "dense"
    from kernels.cpu.build import source_hash

    return f"gguf-{layers[0].activations}:{source_hash()}"
