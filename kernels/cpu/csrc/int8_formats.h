// GGUF groups as int8 integers for the int8-activation path (int8_drivers.h): the dot product of
// a group of 32 weights with a group of 32 int8 activations is exact in integers, then scaled.
//
// Each format is a struct with `group(row, g, &w, &a, &b)`: the g-th group of 32 weights of a
// row is a * q + b, q the 32 bytes of `w` in input order (kSigned: int8 in -128..127, else
// uint8 in 0..63); kScale16 formats (Q6_K) also give a 16-bit scale per pair of inputs
// (`scales`) by which q is multiplied first. Values are those of dequant_avx2.h: the effective
// weight a * q + b equals gguf.quants.dequantize's up to float32 rounding (a and b are exact
// products of the stored scales).
#pragma once

#include <immintrin.h>

#include "dequant_avx2.h"

namespace goodspeed {

// 16 bytes of nibbles as 32 bytes: byte i < 16 is byte i's low nibble, i + 16 its high one.
GS_AVX2 inline __m256i nibble_bytes(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128((const __m128i*)p), low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

// The 32 bits of qh as 32 bytes, 0x10 where bit i is set (the fifth bit of weight i).
GS_AVX2 inline __m256i fifth_bits(uint32_t qh) {
  // Byte i takes byte i / 8 of qh; or-ing every bit but i % 8 leaves 0xFF exactly where set.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)qh),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

struct Q8_0_i8 {
  static constexpr bool kSigned = true, kMin = false, kScale16 = false;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b) {
    const uint8_t* blk = row + g * 34;
    *a = half_f16c(blk);
    *b = 0.0f;
    *w = _mm256_loadu_si256((const __m256i*)(blk + 2));
  }
};

struct Q4_0_i8 {
  static constexpr bool kSigned = true, kMin = false, kScale16 = false;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b) {
    const uint8_t* blk = row + g * 18;
    *a = half_f16c(blk);
    *b = 0.0f;
    *w = _mm256_sub_epi8(nibble_bytes(blk + 2), _mm256_set1_epi8(8));
  }
};

struct Q4_1_i8 {
  static constexpr bool kSigned = false, kMin = true, kScale16 = false;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b) {
    const uint8_t* blk = row + g * 20;
    *a = half_f16c(blk);
    *b = half_f16c(blk + 2);
    *w = nibble_bytes(blk + 4);
  }
};

struct Q5_0_i8 {
  static constexpr bool kSigned = true, kMin = false, kScale16 = false;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b) {
    const uint8_t* blk = row + g * 22;
    *a = half_f16c(blk);
    *b = 0.0f;
    const __m256i q = _mm256_or_si256(nibble_bytes(blk + 6), fifth_bits(load_u32(blk + 2)));
    *w = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
  }
};

struct Q5_1_i8 {
  static constexpr bool kSigned = false, kMin = true, kScale16 = false;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b) {
    const uint8_t* blk = row + g * 24;
    *a = half_f16c(blk);
    *b = half_f16c(blk + 2);
    *w = _mm256_or_si256(nibble_bytes(blk + 8), fifth_bits(load_u32(blk + 4)));
  }
};

// Q4_K (kFive = false) and Q5_K: sub-block s of a super-block is (d * sc) * q - dmin * mn.
template <bool kFive>
struct Q45_K_i8 {
  static constexpr bool kSigned = false, kMin = true, kScale16 = false;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b) {
    const uint8_t* blk = row + (g / 8) * (kFive ? 176 : 144);
    const int s = (int)(g % 8);
    int sc, mn;
    k4_scale(blk + 4, s, &sc, &mn);
    *a = half_f16c(blk) * (float)sc;
    *b = -(half_f16c(blk + 2) * (float)mn);
    const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + (kFive ? 48 : 16) + 32 * (s / 2)));
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i q = s % 2 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), low) : _mm256_and_si256(v, low);
    if (kFive) {  // bit s of byte i of qh is the fifth bit of weight i
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
      const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)),
                                           _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(top, 4));
    }
    *w = q;
  }
};

// Q6_K: d * sc * (q - 32), sc an int8 scale per 16 weights (as dequant_avx2.h's Q6_K).
struct Q6_K_i8 {
  static constexpr bool kSigned = true, kMin = false, kScale16 = true;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256i* w, float* a, float* b,
                            __m256i* scales) {
    const uint8_t* blk = row + (g / 8) * 210;
    const int s = (int)(g % 8), h = s / 4, k = s % 4;
    const int8_t* sc = (const int8_t*)(blk + 192);
    *a = half_f16c(blk + 208);
    *b = 0.0f;
    const __m256i ql = _mm256_loadu_si256((const __m256i*)(blk + 64 * h + 32 * (k % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h));
    const __m256i low = k / 2 ? _mm256_srli_epi16(ql, 4) : ql;
    const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)),
                                         _mm256_set1_epi8(3));
    const __m256i q = _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi8(0x0F)),
                                      _mm256_slli_epi16(top, 4));
    *w = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
    // 16-bit lanes 0..7 hold the pair sums of weights 0..15, lanes 8..15 those of 16..31.
    *scales = _mm256_set_m128i(_mm_set1_epi16(sc[2 * s + 1]), _mm_set1_epi16(sc[2 * s]));
  }
};

}  // namespace goodspeed
