// Register tiles over a dequantised panel: R activation rows x C of the panel's kPanel columns.
//
// The reduction order of one output y[m, n] is fixed, whatever the tile, the batch size M or
// the thread count (this is what makes the op batch invariant): eight float32 lanes
// acc[l] = sum over chunks c, in order, of w[n, 8c + l] * x[m, 8c + l], then
// y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)).
// The AVX2 tile fuses each multiply-add (one rounding); the scalar tile rounds twice.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "dequant_avx2.h"

namespace goodspeed {

// Output columns per panel: divisible by every tile width below (12, 6, 4, 3).
constexpr int kPanel = 12;

inline float lane_sum(const float a[8]) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// panel points at column col0 of chunk 0; chunk c of that column is at panel + c * kPanel * 8.
template <int R, int C>
inline void tile_scalar(const float* x, int64_t x_stride, const float* panel, int64_t chunks,
                        float out[R][C]) {
  float acc[R][C][8] = {};
  for (int64_t c = 0; c < chunks; ++c) {
    const float* w = panel + c * kPanel * 8;
    GS_UNROLL for (int r = 0; r < R; ++r) {
      const float* xc = x + r * x_stride + c * 8;
      GS_UNROLL for (int j = 0; j < C; ++j) {
        GS_UNROLL for (int l = 0; l < 8; ++l) acc[r][j][l] = acc[r][j][l] + w[j * 8 + l] * xc[l];
      }
    }
  }
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) out[r][j] = lane_sum(acc[r][j]);
  }
}

GS_AVX2 inline float lane_sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l + (l + 4)
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                       // 0 + 2, 1 + 3
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int R, int C>
GS_AVX2 inline void tile_avx2(const float* x, int64_t x_stride, const float* panel,
                              int64_t chunks, float out[R][C]) {
  __m256 acc[R][C];
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const float* w = panel + c * kPanel * 8;
    __m256 xv[R];
    GS_UNROLL for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * x_stride + c * 8);
    GS_UNROLL for (int j = 0; j < C; ++j) {
      const __m256 wv = _mm256_loadu_ps(w + j * 8);
      GS_UNROLL for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(wv, xv[r], acc[r][j]);
    }
  }
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) out[r][j] = lane_sum_avx2(acc[r][j]);
  }
}

// The fused variant for few rows: each group of 32 weights of C weight rows is decoded in
// registers (F::group) and applied at once to all R activation rows, with no panel store.
// Same chunks, same order, same fused multiply-adds as tile_avx2, so the same result bitwise.
template <class F, int R, int C>
GS_AVX2 inline void fused_tile_avx2(const float* x, int64_t x_stride, const uint8_t* rows,
                                    int64_t row_bytes, int64_t K, float out[R][C]) {
  __m256 acc[R][C];
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < K / 32; ++g) {
    GS_UNROLL for (int j = 0; j < C; ++j) {
      __m256 w[4];
      F::group(rows + j * row_bytes, g, w);
      GS_UNROLL for (int i = 0; i < 4; ++i) {
        GS_UNROLL for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_loadu_ps(x + r * x_stride + g * 32 + i * 8);
          acc[r][j] = _mm256_fmadd_ps(w[i], xv, acc[r][j]);
        }
      }
    }
  }
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) out[r][j] = lane_sum_avx2(acc[r][j]);
  }
}

}  // namespace goodspeed
