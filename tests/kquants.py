"""K-quant encoders for test models (the `gguf` package can dequantise Q4_K, Q5_K and Q6_K but
not quantize them): simple min/max scale choices, not llama.cpp's search, but valid blocks whose
values gguf.quants.dequantize reads back within a few percent of the input.

Layouts (per 256-value super-block, little endian):
  Q4_K  d f16 | dmin f16 | 12 bytes of 6-bit (scale, min) pairs | 128 bytes: byte 32p + l holds
        sub-block 2p's value l (low nibble) and sub-block 2p + 1's (high); w = d*sc*q - dmin*mn
  Q5_K  as Q4_K with 32 bytes of fifth bits after the scales (byte l, bit s: sub-block s)
  Q6_K  ql 128 | qh 64 | 16 int8 scales (one per 16 values) | d f16; w = d * sc * (q - 32)
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)


def quantize(values: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [rows, K] (K a multiple of 256) -> uint8 [rows, K / 256 * block bytes]."""
    rows, width = values.shape
    if width % 256:
        raise ValueError(f"K-quants need rows of a multiple of 256 values, got {width}")
    blocks = values.astype(np.float32).reshape(-1, 256)
    encode = _q6_k if qtype == Q.Q6_K else (lambda b: _q45_k(b, five=qtype == Q.Q5_K))
    return encode(blocks).reshape(rows, -1)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _safe_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def _q45_k(blocks: np.ndarray, five: bool) -> np.ndarray:
    n, top = len(blocks), 31 if five else 15
    subs = blocks.reshape(n, 8, 32)
    mins = np.maximum(0.0, -subs.min(axis=2))
    scales = (subs.max(axis=2) + mins) / top
    d, dmin = _f16(scales.max(axis=1) / 63), _f16(mins.max(axis=1) / 63)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_safe_divide(scales, d32)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_divide(mins, dmin32)), 0, 63).astype(np.uint8)
    step = (d32 * sc)[:, :, None]
    offset = (dmin32 * mn)[:, :, None]
    q = np.clip(np.rint(_safe_divide(subs + offset, step)), 0, top).astype(np.uint8)
    packed = np.zeros((n, 12), np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    low = q & 0x0F  # [n, 8 sub-blocks, 32]
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(n, 128)
    parts = [d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), packed]
    if five:
        bits = (q >> 4).astype(np.uint8)  # [n, 8, 32]
        qh = np.zeros((n, 32), np.uint8)
        for s in range(8):
            qh |= bits[:, s, :] << s
        parts.append(qh)
    return np.concatenate([*parts, qs], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    n = len(blocks)
    subs = blocks.reshape(n, 16, 16)
    scales = np.abs(subs).max(axis=2) / 31
    d = _f16(scales.max(axis=1) / 127)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_safe_divide(scales, d32)), -128, 127).astype(np.int8)
    step = (d32 * sc)[:, :, None]
    q = (np.clip(np.rint(_safe_divide(subs, step)), -32, 31) + 32).astype(np.uint8).reshape(n, 256)
    ql, qh = np.zeros((n, 128), np.uint8), np.zeros((n, 64), np.uint8)
    for e in range(256):
        h, g, lane = e // 128, (e % 128) // 32, e % 32
        ql[:, 64 * h + 32 * (g % 2) + lane] |= (q[:, e] & 0x0F) << (4 * (g // 2))
        qh[:, 32 * h + lane] |= (q[:, e] >> 4) << (2 * g)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(n, 2)], axis=1)


def q4_k_m(name: str) -> Q:
    """The mix of llama.cpp's Q4_K_M, by HF tensor name: Q6_K for the value projections, the
    down projections and the head, Q4_K elsewhere (write_gguf's `qtype`)."""
    return Q.Q6_K if any(part in name for part in ("v_proj", "down_proj", "lm_head")) else Q.Q4_K
