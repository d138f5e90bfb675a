// The int8-activation path (llama.cpp's arithmetic): each activation row is quantized per group
// of 32 inputs to int8 with its own scale, then every (activation group, weight group) product
// is an exact integer dot product (AVX2 maddubs), scaled and summed in float32.
//
// Contract: y[m, n] depends on x[m] and W[n] only (a row's quantization uses its own values),
// and its float32 reduction order is fixed, whatever M, the tile or the thread count: two sums
// over the even and the odd groups, in order, of 8 lanes (acc) and of the formats' offset terms
// (off); y = lane_sum(acc_even + acc_odd) + (off_even + off_odd). So a row is bitwise the same
// alone or in any batch. Quantization: d = amax / 127, q = round-half-even(x * (1 / d)), as
// kernels/cpu/fallback.py's quantize_rows does.
#pragma once

#include <cmath>
#include <vector>

#include "drivers.h"
#include "int8_formats.h"

namespace goodspeed {

struct ActQ8 {
  const int8_t* q;  // [M, K]
  const float* d;   // [M, K / 32]: the groups' scales
  const float* sd;  // [M, K / 32]: d * (sum of the group's q)
  const int32_t* sum;  // [M, K / 32]: the sum of the group's q
  int64_t K, G;
};

// Per row and group of 32: q = nearbyint(x / d) in the default (half-even) rounding mode.
inline void quantize_rows(const float* x, int64_t x_stride, int64_t M, int64_t K, int8_t* q,
                          float* d, float* sd, int32_t* sums) {
  const int64_t G = K / 32;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = x + m * x_stride + g * 32;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xg[i]));
      const float dg = amax / 127.0f, id = dg != 0.0f ? 1.0f / dg : 0.0f;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int v = (int)std::nearbyint(xg[i] * id);
        q[m * K + g * 32 + i] = (int8_t)v;
        sum += v;
      }
      d[m * G + g] = dg;
      sd[m * G + g] = dg * (float)sum;
      sums[m * G + g] = sum;
    }
  }
}

// The same values with AVX2 (same float operations, the same rounding mode).
GS_AVX2 inline void quantize_rows_avx2(const float* x, int64_t x_stride, int64_t M, int64_t K,
                                       int8_t* q, float* d, float* sd, int32_t* sums) {
  const int64_t G = K / 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = x + m * x_stride + g * 32;
      __m256 v[4], amax = _mm256_setzero_ps();
      GS_UNROLL for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xg + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      const float top = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
      const float dg = top / 127.0f, id = dg != 0.0f ? 1.0f / dg : 0.0f;
      __m256i n[4];
      GS_UNROLL for (int i = 0; i < 4; ++i) {
        const __m256 scaled = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
        n[i] = _mm256_cvtps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      const __m256i total = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
      // packs work within 128-bit lanes: restore the element order with one permute.
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
      _mm256_storeu_si256((__m256i*)(q + m * K + g * 32), _mm256_permutevar8x32_epi32(bytes, order));
      d[m * G + g] = dg;
      sd[m * G + g] = dg * (float)_mm_cvtsi128_si32(t);
      sums[m * G + g] = _mm_cvtsi128_si32(t);
    }
  }
}

// Owns the quantized rows of one call (the calling thread's buffers, reused between calls).
struct QuantizedRows {
  ActQ8 view;
  QuantizedRows(const float* x, int64_t x_stride, int64_t M, int64_t K, bool avx2) {
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> d, sd;
    thread_local std::vector<int32_t> sums;
    const int64_t G = K / 32;
    q.resize(M * K);
    d.resize(M * G);
    sd.resize(M * G);
    sums.resize(M * G);
    if (avx2) {
      quantize_rows_avx2(x, x_stride, M, K, q.data(), d.data(), sd.data(), sums.data());
    } else {
      quantize_rows(x, x_stride, M, K, q.data(), d.data(), sd.data(), sums.data());
    }
    view = ActQ8{q.data(), d.data(), sd.data(), sums.data(), K, G};
  }
};

template <class F, int R, int C>
GS_AVX2 inline void int8_group(const ActQ8& x, int64_t r0, const uint8_t* rows,
                               int64_t row_bytes, int64_t g, __m256 acc[R][C], float off[R][C]) {
  GS_UNROLL for (int j = 0; j < C; ++j) {
    __m256i w, pair_scale = _mm256_set1_epi16(1);
    float a, b;
    if constexpr (F::kScale16) {
      F::group(rows + j * row_bytes, g, &w, &a, &b, &pair_scale);
    } else {
      F::group(rows + j * row_bytes, g, &w, &a, &b);
    }
    const __m256i magnitude = F::kSigned ? _mm256_sign_epi8(w, w) : w;  // maddubs: u8 x s8
    GS_UNROLL for (int r = 0; r < R; ++r) {
      const __m256i xq = _mm256_loadu_si256((const __m256i*)(x.q + (r0 + r) * x.K + g * 32));
      const __m256i xs = F::kSigned ? _mm256_sign_epi8(xq, w) : xq;
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xs), pair_scale);
      acc[r][j] = _mm256_fmadd_ps(_mm256_set1_ps(a * x.d[(r0 + r) * x.G + g]), _mm256_cvtepi32_ps(dot), acc[r][j]);
      if constexpr (F::kMin) off[r][j] = off[r][j] + b * x.sd[(r0 + r) * x.G + g];
    }
  }
}

template <class F, int R, int C>
GS_AVX2 inline void int8_tile(const ActQ8& x, int64_t r0, const uint8_t* rows, int64_t row_bytes,
                              float out[R][C]) {
  __m256 acc0[R][C], acc1[R][C];
  float off0[R][C] = {}, off1[R][C] = {};
  zero<R, C>(acc0);
  zero<R, C>(acc1);
  if constexpr (R * C <= 2) {  // few outputs: both sums in one loop, independent chains
    for (int64_t g = 0; g < x.G; g += 2) {
      int8_group<F, R, C>(x, r0, rows, row_bytes, g, acc0, off0);
      if (g + 1 < x.G) int8_group<F, R, C>(x, r0, rows, row_bytes, g + 1, acc1, off1);
    }
  } else {  // the even groups, then the odd ones: half the live accumulators
    for (int64_t g = 0; g < x.G; g += 2) int8_group<F, R, C>(x, r0, rows, row_bytes, g, acc0, off0);
    for (int64_t g = 1; g < x.G; g += 2) int8_group<F, R, C>(x, r0, rows, row_bytes, g, acc1, off1);
  }
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) {
      out[r][j] = lane_sum_avx2(_mm256_add_ps(acc0[r][j], acc1[r][j])) + (off0[r][j] + off1[r][j]);
    }
  }
}

// Rows r0 .. r0 + R - 1 against the columns n0 .. n0 + cols - 1, C weight rows per tile.
template <class F, int R, int C>
void int8_cols(const Problem& p, const ActQ8& x, int64_t r0, int64_t n0, int64_t cols) {
  int64_t j0 = 0;
  for (; cols - j0 >= C; j0 += C) {
    float res[R][C];
    int8_tile<F, R, C>(x, r0, p.blocks + (n0 + j0) * p.row_bytes, p.row_bytes, res);
    store<R, C>(p, r0, n0 + j0, C, res);
  }
  for (; j0 < cols; ++j0) {
    float res[R][1];
    int8_tile<F, R, 1>(x, r0, p.blocks + (n0 + j0) * p.row_bytes, p.row_bytes, res);
    store<R, 1>(p, r0, n0 + j0, 1, res);
  }
}

// Panels of kPanel columns; within one, tiles of up to 4 rows (activations and the panel's
// weights both stay in L1 while a row tile sweeps the columns).
template <class F>
void run_int8_panels(const Problem& p, const ActQ8& x, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t n0 = i * kPanel, cols = std::min<int64_t>(kPanel, p.N - n0);
    int64_t r0 = 0;
    for (; p.M - r0 >= 4; r0 += 4) int8_cols<F, 4, 1>(p, x, r0, n0, cols);
    switch (p.M - r0) {
      case 3: int8_cols<F, 3, 1>(p, x, r0, n0, cols); break;
      case 2: int8_cols<F, 2, 2>(p, x, r0, n0, cols); break;
      case 1: int8_cols<F, 1, 1>(p, x, r0, n0, cols); break;
    }
  }
}

// The scalar path's int8 mode: the quantized rows as floats (d * q), for the float kernels.
inline void dequantize_rows(const ActQ8& x, int64_t M, std::vector<float>& out) {
  out.resize(M * x.K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < x.K; ++k) {
      out[m * x.K + k] = x.d[m * x.G + k / 32] * (float)x.q[m * x.K + k];
    }
  }
}

template <class Fn>
void with_int8_format(int64_t format, Fn fn) {
  switch (format) {
    case kQ8_0: fn(Q8_0_i8{}); break;
    case kQ4_0: fn(Q4_0_i8{}); break;
    case kQ4_1: fn(Q4_1_i8{}); break;
    case kQ5_0: fn(Q5_0_i8{}); break;
    case kQ5_1: fn(Q5_1_i8{}); break;
    case kQ4_K: fn(Q45_K_i8<false>{}); break;
    case kQ5_K: fn(Q45_K_i8<true>{}); break;
    case kQ6_K: fn(Q6_K_i8{}); break;
  }
}

}  // namespace goodspeed
