// Integer activations for the tile kernels (qint_kernel.h): each row of x is quantized per group
// of 32 inputs with its own scale, so a row's values never depend on the batch.
//
//   int8:  d = amax / 127,   q = round-half-even(x * (1 / d)), q in [-127, 127]; hi = q.
//   int16: d = amax / 32639, q likewise in [-32639, 32639], split for u8 x s8 dot products as
//          q = 256 * hi + lo with hi = (q + 128) >> 8 in [-127, 127], lo in [-128, 127].
// Every step is one correctly rounded float operation or exact integer arithmetic, so the scalar,
// AVX2 and AVX-512 versions give the same bytes. A group holding a NaN or an infinity gets
// d = NaN, so the layer's outputs for that row are NaN (a bad row shows, it is not hidden).
// Beside the planes: per group d, per 16 inputs the sum of q (the kernels' offset terms), and per
// group d * (its sum of q) as a float (the min terms of Q4_1, Q5_1 and the K-quants).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

namespace goodspeed {

enum class ActMode : int64_t { kFloat32 = 0, kInt8 = 1, kInt16 = 2 };

inline int32_t act_levels(ActMode mode) { return mode == ActMode::kInt16 ? 32639 : 127; }

// A view of quantized rows: hi, lo int8 [M, K] (lo only for int16), d float [M, K / 32],
// sum16 int32 [M, K / 16], dsum float [M, K / 32].
struct Acts {
  const int8_t* hi;
  const int8_t* lo;  // nullptr in int8 mode
  const float* d;
  const int32_t* sum16;
  const float* dsum;  // d * float(sum of the group's 32 q): one rounding
  int64_t M, K;

  // The 4 int8 values of inputs i .. i + 3 of a row, as one 32-bit word (dot-product operand).
  int32_t hi_word(int64_t row, int64_t i) const { return word(hi + row * K + i); }
  int32_t lo_word(int64_t row, int64_t i) const { return word(lo + row * K + i); }
  float scale(int64_t row, int64_t group) const { return d[row * (K / 32) + group]; }
  int32_t sum(int64_t row, int64_t chunk16) const { return sum16[row * (K / 16) + chunk16]; }
  float scaled_group_sum(int64_t row, int64_t group) const { return dsum[row * (K / 32) + group]; }

 private:
  static int32_t word(const int8_t* p) {
    int32_t w;
    std::memcpy(&w, p, 4);
    return w;
  }
};

// Stores one group's 32 values q (already rounded, |q| <= levels) into the planes and sums; a
// group with d = NaN stores zeros (its q came from NaN or infinite inputs).
inline void store_group(int32_t q[32], float d, ActMode mode, int8_t* hi, int8_t* lo,
                        int32_t* sum16) {
  if (d != d) std::fill(q, q + 32, 0);
  for (int h = 0; h < 2; ++h) {
    int32_t s = 0;
    for (int i = 16 * h; i < 16 * h + 16; ++i) s += q[i];
    sum16[h] = s;
  }
  for (int i = 0; i < 32; ++i) {
    if (mode == ActMode::kInt16) {
      const int32_t top = (q[i] + 128) >> 8;  // arithmetic shift: floor
      hi[i] = (int8_t)top;
      lo[i] = (int8_t)(q[i] - 256 * top);
    } else {
      hi[i] = (int8_t)q[i];
    }
  }
}

// d for a group whose largest magnitude is amax (NaN if it held a NaN or an infinity).
inline float group_scale(float amax, bool bad, ActMode mode) {
  if (bad || !(amax <= std::numeric_limits<float>::max())) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  return amax / (float)act_levels(mode);
}

inline float inverse_scale(float d) { return d != 0.0f && d == d ? 1.0f / d : 0.0f; }

// Owns the quantized rows of one linear call (thread-local buffers reused between calls).
class QuantizedActs {
 public:
  QuantizedActs(const float* x, int64_t x_stride, int64_t M, int64_t K, ActMode mode);
  const Acts& view() const { return view_; }

 private:
  Acts view_;
};

namespace act_detail {

inline void quantize_row_scalar(const float* x, int64_t K, ActMode mode, int8_t* hi, int8_t* lo,
                                float* d, int32_t* sum16) {
  for (int64_t g = 0; g < K / 32; ++g) {
    const float* xg = x + 32 * g;
    float amax = 0.0f;
    bool bad = false;
    for (int i = 0; i < 32; ++i) {
      bad |= std::isnan(xg[i]);
      amax = std::max(amax, std::fabs(xg[i]));
    }
    d[g] = group_scale(amax, bad, mode);
    const float id = inverse_scale(d[g]);
    int32_t q[32];
    for (int i = 0; i < 32; ++i) {
      const float r = std::nearbyint(xg[i] * id);
      q[i] = r == r ? (int32_t)r : 0;  // NaN only in a bad group, which stores zeros
    }
    store_group(q, d[g], mode, hi + 32 * g, lo ? lo + 32 * g : nullptr, sum16 + 2 * g);
  }
}

__attribute__((target("avx2,fma,f16c"))) inline void quantize_row_avx2(
    const float* x, int64_t K, ActMode mode, int8_t* hi, int8_t* lo, float* d, int32_t* sum16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t g = 0; g < K / 32; ++g) {
    const float* xg = x + 32 * g;
    __m256 v[4], amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xg + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float top = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    d[g] = group_scale(top, _mm256_movemask_ps(nan) != 0, mode);
    const __m256 id = _mm256_set1_ps(inverse_scale(d[g]));
    alignas(32) int32_t q[32];
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_store_si256((__m256i*)(q + 8 * i), _mm256_cvtps_epi32(r));
    }
    store_group(q, d[g], mode, hi + 32 * g, lo ? lo + 32 * g : nullptr, sum16 + 2 * g);
  }
}

inline bool has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

}  // namespace act_detail

// `avx2`: take the AVX2 quantizer (same bytes as the scalar one; tests check it).
inline void quantize_acts(const float* x, int64_t x_stride, int64_t M, int64_t K, ActMode mode,
                          bool avx2, int8_t* hi, int8_t* lo, float* d, int32_t* sum16) {
  for (int64_t m = 0; m < M; ++m) {
    int8_t* row_lo = lo ? lo + m * K : nullptr;
    if (avx2) {
      act_detail::quantize_row_avx2(x + m * x_stride, K, mode, hi + m * K, row_lo, d + m * (K / 32),
                                    sum16 + m * (K / 16));
    } else {
      act_detail::quantize_row_scalar(x + m * x_stride, K, mode, hi + m * K, row_lo,
                                      d + m * (K / 32), sum16 + m * (K / 16));
    }
  }
}

inline QuantizedActs::QuantizedActs(const float* x, int64_t x_stride, int64_t M, int64_t K,
                                    ActMode mode) {
  thread_local std::vector<int8_t> hi, lo;
  thread_local std::vector<float> d;
  thread_local std::vector<int32_t> sum16;
  thread_local std::vector<float> dsum;
  hi.resize(M * K);
  lo.resize(mode == ActMode::kInt16 ? M * K : 0);
  d.resize(M * (K / 32));
  sum16.resize(M * (K / 16));
  int8_t* lo_data = mode == ActMode::kInt16 ? lo.data() : nullptr;
  quantize_acts(x, x_stride, M, K, mode, act_detail::has_avx2(), hi.data(), lo_data, d.data(),
                sum16.data());
  dsum.resize(M * (K / 32));
  for (int64_t g = 0; g < M * (K / 32); ++g) {
    dsum[g] = d[g] * (float)(sum16[2 * g] + sum16[2 * g + 1]);
  }
  view_ = Acts{hi.data(), lo_data, d.data(), sum16.data(), dsum.data(), M, K};
}

}  // namespace goodspeed
