// GGUF block formats the kernels read as stored, and helpers shared by the scalar and AVX2 paths.
//
// Type ids are ggml's (gguf.GGMLQuantizationType). Blocks hold 32 weights (Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1) or
// 256 (K-quants) along the input dimension; a weight row of K inputs is K / elems blocks.
#pragma once

#include <cstdint>
#include <cstring>

namespace goodspeed {

enum Format : int64_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14
};

struct BlockShape {
  int64_t elems;  // weights per block
  int64_t bytes;  // bytes per block
};

// {0, 0} for a type this code does not read.
inline BlockShape block_shape(int64_t format) {
  switch (format) {
    case kQ4_0: return {32, 18};
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ5_1: return {32, 24};
    case kQ8_0: return {32, 34};
    case kQ4_K: return {256, 144};
    case kQ5_K: return {256, 176};
    case kQ6_K: return {256, 210};
    default: return {0, 0};
  }
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // blocks are unaligned (Q8_0 is 34 bytes)
  return v;
}

// IEEE half -> float, exact for every input (subnormals included), as numpy's astype does.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise into a float
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    bits = sign | ((uint32_t)(113 - shift) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Q4_K / Q5_K: sub-block j's six-bit scale and min, from the 12 packed bytes at s (ggml's
// get_scale_min_k4; gguf.quants.Q4_K.get_scale_min unpacks the same bits).
inline void k4_scale(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

}  // namespace goodspeed
