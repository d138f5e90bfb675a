// Portable dequantisation of one weight row, value for value what gguf.quants.dequantize gives:
// the same float32 operations in the same order (every scale * quant product below is exact in
// float32, so one rounding at most, as in numpy). The row's K weights are written as K / 8
// chunks of 8 floats, chunk c at dst + c * stride (stride 8: a plain row; larger: a panel).
#pragma once

#include "common.h"

namespace goodspeed {

// Writes one block's `n` dequantised weights (n = 32 or 256) as chunks.
inline void put_chunks(const float* w, int64_t n, float* dst, int64_t stride) {
  for (int64_t c = 0; c < n / 8; ++c) std::memcpy(dst + c * stride, w + c * 8, 8 * sizeof(float));
}

inline void block_q8_0(const uint8_t* b, float* w) {
  const float d = half_to_float(load_u16(b));
  for (int i = 0; i < 32; ++i) w[i] = (float)(int8_t)b[2 + i] * d;
}

inline void block_q4_0(const uint8_t* b, float* w) {
  const float d = half_to_float(load_u16(b));
  for (int i = 0; i < 16; ++i) {
    w[i] = d * (float)((b[2 + i] & 0x0F) - 8);
    w[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
  }
}

inline void block_q4_1(const uint8_t* b, float* w) {
  const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
  for (int i = 0; i < 16; ++i) {
    w[i] = d * (float)(b[4 + i] & 0x0F) + m;
    w[i + 16] = d * (float)(b[4 + i] >> 4) + m;
  }
}

// Q5_0 / Q5_1: like Q4_0 / Q4_1 with a fifth bit per weight: bit i of the little-endian 32-bit
// qh after the scale(s) belongs to weight i (i < 16: low nibbles, i >= 16: high nibbles).
inline int five_bit(const uint8_t* qs, uint32_t qh, int i) {
  const int low = i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4);
  return low | (int)(((qh >> i) & 1u) << 4);
}

inline void block_q5_0(const uint8_t* b, float* w) {
  const float d = half_to_float(load_u16(b));
  const uint32_t qh = load_u32(b + 2);
  for (int i = 0; i < 32; ++i) w[i] = d * (float)(five_bit(b + 6, qh, i) - 16);
}

inline void block_q5_1(const uint8_t* b, float* w) {
  const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
  const uint32_t qh = load_u32(b + 4);
  for (int i = 0; i < 32; ++i) w[i] = d * (float)five_bit(b + 8, qh, i) + m;
}

// Q4_K and Q5_K: sub-block s of 32 is (d * sc[s]) * q - (dmin * mn[s]); nibbles of 32 bytes
// hold sub-blocks 2j (low) and 2j + 1 (high); Q5_K's fifth bit of sub-block s is bit s of qh[l].
inline void block_q45_k(const uint8_t* b, float* w, bool five_bits) {
  const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five_bits ? b + 48 : b + 16;
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    k4_scale(b + 4, s, &sc, &mn);
    const float scale = d * (float)sc, offset = dmin * (float)mn;
    const uint8_t* q = qs + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      int v = (s % 2 == 0) ? (q[l] & 0x0F) : (q[l] >> 4);
      if (five_bits) v |= ((qh[l] >> s) & 1) << 4;
      w[32 * s + l] = scale * (float)v - offset;
    }
  }
}

// Q6_K: per half h of 128: four groups g of 32; low 4 bits from ql (bytes 64h + 32 * (g % 2)
// + l, nibble g / 2), high 2 bits from qh[32h + l] >> 2g; (d * sc[e / 16]) * (q - 32).
inline void block_q6_k(const uint8_t* b, float* w) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t* sc = (const int8_t*)(b + 192);
  const float d = half_to_float(load_u16(b + 208));
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    const uint8_t low = ql[64 * h + 32 * (g % 2) + l];
    const int q = ((g < 2 ? low & 0x0F : low >> 4) | (((qh[32 * h + l] >> (2 * g)) & 3) << 4));
    w[e] = (d * (float)sc[e / 16]) * (float)(q - 32);
  }
}

inline void dequant_row_scalar(int64_t format, const uint8_t* row, int64_t K, float* dst,
                               int64_t stride) {
  const BlockShape shape = block_shape(format);
  float w[256];
  for (int64_t i = 0; i < K / shape.elems; ++i) {
    const uint8_t* b = row + i * shape.bytes;
    switch (format) {
      case kQ8_0: block_q8_0(b, w); break;
      case kQ4_0: block_q4_0(b, w); break;
      case kQ4_1: block_q4_1(b, w); break;
      case kQ5_0: block_q5_0(b, w); break;
      case kQ5_1: block_q5_1(b, w); break;
      case kQ4_K: block_q45_k(b, w, false); break;
      case kQ5_K: block_q45_k(b, w, true); break;
      case kQ6_K: block_q6_k(b, w); break;
    }
    put_chunks(w, shape.elems, dst + (i * shape.elems / 8) * stride, stride);
  }
}

}  // namespace goodspeed
