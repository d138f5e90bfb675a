"""`--weights q8_0`: a float checkpoint's linear weights and embedding quantized to Q8_0 blocks
as they load, so a safetensors model runs the native CPU kernels as a Q8_0 GGUF would.

Each 2-D weight row of a width divisible by 32 becomes gguf.quants.quantize's Q8_0 blocks
(llama.cpp's quantizer: per 32 values, d = amax / 127 as fp16, q = round(x / d)); a tied
model's head runs the embedding's blocks. The result equals loading the GGUF that llama.cpp's
converter would write with Q8_0 for those tensors (tested bit for bit).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.models.gguf_loader import EMBEDDING, is_linear_weight
from kernels.cpu import QuantizedWeight

Q8_0 = GGMLQuantizationType.Q8_0


def to_q8_0(tensor: torch.Tensor) -> QuantizedWeight:
    blocks = quantize(tensor.detach().to(torch.float32).numpy(), Q8_0)
    return QuantizedWeight(int(Q8_0), torch.from_numpy(blocks), tensor.shape[1])


def quantized_to_q8_0(
    weights: Iterable[tuple[str, torch.Tensor]], tie_word_embeddings: bool
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """The checkpoint's (name, tensor) pairs, linear weights and the embedding as Q8_0."""
    for name, tensor in weights:
        fits = tensor.dim() == 2 and tensor.shape[1] % 32 == 0
        if name == "lm_head.weight" and tie_word_embeddings:
            continue  # the tied head comes from the embedding below
        if not fits or not (is_linear_weight(name) or name == EMBEDDING):
            yield name, tensor
            continue
        blocks = to_q8_0(tensor)
        yield name, blocks
        if name == EMBEDDING and tie_word_embeddings:
            yield "lm_head.weight", blocks
