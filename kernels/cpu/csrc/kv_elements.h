// What one number of the paged KV cache is: float32, or a 16-bit float kept as its bits
// (IEEE binary16 `Half`, or `BFloat16`). Keys and values are rounded once, to nearest even,
// when a step writes them, and read back exactly (a 16-bit float widens to float32 without
// error), so every invariance of the attention paths (a row alone or batched, a chain token vs
// its decode step) holds for every element type: the arithmetic after the load is float32.
//
// The scalar conversions here are the reference; the vector paths widen with F16C
// (_mm256_cvtph_ps, _mm512_cvtph_ps) or a 16-bit shift (bfloat16), which give the same floats.
#pragma once

#include <cstdint>
#include <cstring>

namespace goodspeed {

struct Half {
  uint16_t bits;
};

struct BFloat16 {
  uint16_t bits;
};

inline float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t bits_of_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float to_float(float x) { return x; }

inline float to_float(BFloat16 x) { return float_of_bits((uint32_t)x.bits << 16); }

inline float to_float(Half h) {
  const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu, mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f) return float_of_bits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return float_of_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline void store_kv(float* dst, float x) { *dst = x; }

// Round to nearest even; NaN stays a (quiet) NaN.
inline void store_kv(BFloat16* dst, float x) {
  const uint32_t u = bits_of_float(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    dst->bits = (uint16_t)((u >> 16) | 0x40u);
    return;
  }
  dst->bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Round to nearest even, overflow to infinity, subnormals kept; NaN stays a (quiet) NaN.
inline void store_kv(Half* dst, float x) {
  uint32_t u = bits_of_float(x);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  uint16_t bits;
  if (u >= 0x47800000u) {  // |x| >= 2^16: infinity, or NaN
    bits = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // |x| < 2^-14: a subnormal half (or zero)
    // Adding 0.5 puts the half's ulp (2^-24) at float32's last mantissa bit, so the float
    // adder's own round-to-nearest-even does the rounding.
    bits = (uint16_t)(bits_of_float(float_of_bits(u) + 0.5f) - 0x3f000000u);
  } else {  // normal: rebias the exponent, round the 13 dropped bits to nearest even
    bits = (uint16_t)((u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13);
  }
  dst->bits = sign | bits;
}

}  // namespace goodspeed
