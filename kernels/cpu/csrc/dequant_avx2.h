// AVX2 + F16C decoding of 32-weight groups, bit for bit the values of dequant_scalar.h (and so
// of gguf.quants.dequantize): integers are widened and converted exactly, fp16 scales come from
// F16C (exact), and each weight takes the same float32 operations (an exact product, then at
// most one rounding: fmadd/fmsub round once, like numpy's multiply-then-add here).
//
// Each format is a struct with `group(row, g, w)`: the g-th group of 32 weights of a row as four
// vectors of 8 (w[q] = weights 8q .. 8q + 7). K-quant groups are sub-blocks of a super-block.
#pragma once

#include <immintrin.h>

#include "common.h"

#define GS_AVX2 __attribute__((target("avx2,fma,f16c")))
// Tiles index register arrays by loop counters: fully unrolled, they stay in registers.
#define GS_UNROLL _Pragma("GCC unroll 16")

namespace goodspeed {

GS_AVX2 inline __m256i widen_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
}

GS_AVX2 inline __m256 to_float(__m256i v) { return _mm256_cvtepi32_ps(v); }

// Two adjacent fp16 values at p, as floats broadcast to all lanes.
GS_AVX2 inline void half_pair(const uint8_t* p, __m256* a, __m256* b) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256 v = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128((int)bits)));
  *a = _mm256_permutevar8x32_ps(v, _mm256_setzero_si256());
  *b = _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(1));
}

GS_AVX2 inline float half_f16c(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }

// Nibbles of 16 bytes as 32 dwords: element i < 16 is byte i's low nibble, i + 16 its high one.
GS_AVX2 inline void nibbles32(const uint8_t* p, __m256i q[4]) {
  const __m256i a = widen_u8(p), b = widen_u8(p + 8), low = _mm256_set1_epi32(0x0F);
  q[0] = _mm256_and_si256(a, low);
  q[1] = _mm256_and_si256(b, low);
  q[2] = _mm256_srli_epi32(a, 4);
  q[3] = _mm256_srli_epi32(b, 4);
}

struct Q8_0 {
  static constexpr int64_t kElems = 32, kBytes = 34;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + g * kBytes;
    const __m256 d = _mm256_set1_ps(half_f16c(b));
    GS_UNROLL for (int q = 0; q < 4; ++q) {
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(b + 2 + 8 * q)));
      w[q] = _mm256_mul_ps(to_float(v), d);
    }
  }
};

struct Q4_0 {
  static constexpr int64_t kElems = 32, kBytes = 18;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + g * kBytes;
    const __m256 d = _mm256_set1_ps(half_f16c(b));
    __m256i q[4];
    nibbles32(b + 2, q);
    GS_UNROLL for (int i = 0; i < 4; ++i) {
      w[i] = _mm256_mul_ps(d, to_float(_mm256_sub_epi32(q[i], _mm256_set1_epi32(8))));
    }
  }
};

struct Q4_1 {
  static constexpr int64_t kElems = 32, kBytes = 20;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + g * kBytes;
    __m256 d, m;
    half_pair(b, &d, &m);
    __m256i q[4];
    nibbles32(b + 4, q);
    GS_UNROLL for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(d, to_float(q[i]), m);
  }
};

// Nibbles of 16 bytes plus the fifth bits (bit i of the 32-bit qh for weight i), as 32 dwords.
GS_AVX2 inline void five_bits32(const uint8_t* qs, uint32_t qh, __m256i q[4]) {
  nibbles32(qs, q);
  const __m256i bits = _mm256_set1_epi32((int)qh), lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  GS_UNROLL for (int i = 0; i < 4; ++i) {
    const __m256i shift = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * i));
    const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(bits, shift), _mm256_set1_epi32(1));
    q[i] = _mm256_or_si256(q[i], _mm256_slli_epi32(top, 4));
  }
}

struct Q5_0 {
  static constexpr int64_t kElems = 32, kBytes = 22;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + g * kBytes;
    const __m256 d = _mm256_set1_ps(half_f16c(b));
    __m256i q[4];
    five_bits32(b + 6, load_u32(b + 2), q);
    GS_UNROLL for (int i = 0; i < 4; ++i) {
      w[i] = _mm256_mul_ps(d, to_float(_mm256_sub_epi32(q[i], _mm256_set1_epi32(16))));
    }
  }
};

struct Q5_1 {
  static constexpr int64_t kElems = 32, kBytes = 24;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + g * kBytes;
    __m256 d, m;
    half_pair(b, &d, &m);
    __m256i q[4];
    five_bits32(b + 8, load_u32(b + 4), q);
    GS_UNROLL for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(d, to_float(q[i]), m);
  }
};

// Q4_K (kFive = false) and Q5_K: (d * sc) * q - dmin * mn per sub-block of 32.
template <bool kFive>
struct Q45_K {
  static constexpr int64_t kElems = 256, kBytes = kFive ? 176 : 144;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + (g / 8) * kBytes;
    const int s = (int)(g % 8);
    int sc, mn;
    k4_scale(b + 4, s, &sc, &mn);
    const __m256 scale = _mm256_set1_ps(half_f16c(b) * (float)sc);
    const __m256 offset = _mm256_set1_ps(half_f16c(b + 2) * (float)mn);
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (s / 2);
    GS_UNROLL for (int i = 0; i < 4; ++i) {
      const __m256i v = widen_u8(qs + 8 * i);
      __m256i q = s % 2 ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0F));
      if (kFive) {
        const __m256i h = _mm256_srl_epi32(widen_u8(b + 16 + 8 * i), _mm_cvtsi32_si128(s));
        q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)), 4));
      }
      w[i] = _mm256_fmsub_ps(scale, to_float(q), offset);
    }
  }
};

// Q6_K: group g of a super-block: half h = g / 4, k = g % 4; low bits from ql bytes
// 64h + 32 * (k % 2) + l (nibble k / 2), high bits from qh[32h + l] >> 2k; (d * sc) * (q - 32).
struct Q6_K {
  static constexpr int64_t kElems = 256, kBytes = 210;
  GS_AVX2 static void group(const uint8_t* row, int64_t g, __m256 w[4]) {
    const uint8_t* b = row + (g / 8) * kBytes;
    const int s = (int)(g % 8), h = s / 4, k = s % 4;
    const float d = half_f16c(b + 208);
    const int8_t* sc = (const int8_t*)(b + 192);
    const uint8_t *ql = b + 64 * h + 32 * (k % 2), *qh = b + 128 + 32 * h;
    GS_UNROLL for (int i = 0; i < 4; ++i) {
      const __m256i v = widen_u8(ql + 8 * i);
      const __m256i low =
          k / 2 ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15));
      const __m256i hi = _mm256_srl_epi32(widen_u8(qh + 8 * i), _mm_cvtsi32_si128(2 * k));
      const __m256i top = _mm256_and_si256(hi, _mm256_set1_epi32(3));
      const __m256i q = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(top, 4)),
                                         _mm256_set1_epi32(32));
      const __m256 scale = _mm256_set1_ps(d * (float)sc[2 * s + i / 2]);
      w[i] = _mm256_mul_ps(scale, to_float(q));
    }
  }
};

// A whole row into chunks: chunk c (8 floats) at dst + c * stride.
template <class F>
GS_AVX2 void dequant_row_avx2(const uint8_t* row, int64_t K, float* dst, int64_t stride) {
  for (int64_t g = 0; g < K / 32; ++g) {
    __m256 w[4];
    F::group(row, g, w);
    GS_UNROLL for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + (4 * g + i) * stride, w[i]);
  }
}

}  // namespace goodspeed
