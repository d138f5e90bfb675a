// Register tiles: R activation rows x C weight rows, over a dequantised panel or decoding the
// GGUF groups in registers.
//
// The reduction order of one output y[m, n] is fixed, whatever the tile, the batch size M or
// the thread count (this is what makes the op batch invariant). Chunk c holds inputs
// 8c .. 8c + 7 and belongs to group g = c / 4 (32 inputs). Two partial sums of eight float32
// lanes: part[h][l] = sum over the chunks c of the groups g = h (mod 2), in order, of
// w[n, 8c + l] * x[m, 8c + l]; acc = part[0] + part[1] lane by lane, then
// y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)).
// Why two: with one chain per output a single row waits on FMA latency (measured at M = 1: the
// Q8_0 head ran at its latency bound, 2.5x slower than five rows). Tiles with few outputs
// interleave the two partials (2 R C accumulators); larger tiles sweep the even groups, then
// the odd ones (R C accumulators), so both fit the 16 ymm registers. Same order either way.
// The AVX2 tiles fuse each multiply-add (one rounding); the scalar tile rounds twice.
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
  float part[2][R][C][8] = {};
  for (int64_t c = 0; c < chunks; ++c) {
    const float* w = panel + c * kPanel * 8;
    GS_UNROLL for (int r = 0; r < R; ++r) {
      const float* xc = x + r * x_stride + c * 8;
      GS_UNROLL for (int j = 0; j < C; ++j) {
        float* a = part[(c / 4) % 2][r][j];
        GS_UNROLL for (int l = 0; l < 8; ++l) a[l] = a[l] + w[j * 8 + l] * xc[l];
      }
    }
  }
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) {
      float acc[8];
      GS_UNROLL for (int l = 0; l < 8; ++l) acc[l] = part[0][r][j][l] + part[1][r][j][l];
      out[r][j] = lane_sum(acc);
    }
  }
}

GS_AVX2 inline float lane_sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l + (l + 4)
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                       // 0 + 2, 1 + 3
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int R, int C>
GS_AVX2 inline void finish(const __m256 part0[R][C], const __m256 part1[R][C], float out[R][C]) {
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) {
      out[r][j] = lane_sum_avx2(_mm256_add_ps(part0[r][j], part1[r][j]));
    }
  }
}

template <int R, int C>
GS_AVX2 inline void zero(__m256 part[R][C]) {
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int j = 0; j < C; ++j) part[r][j] = _mm256_setzero_ps();
  }
}

// One sweep over the groups h, h + 2, ... of a dequantised panel: part = the partial sum h.
template <int R, int C>
GS_AVX2 inline void panel_sweep(const float* x, int64_t x_stride, const float* panel,
                                int64_t groups, int h, __m256 part[R][C]) {
  zero<R, C>(part);
  for (int64_t g = h; g < groups; g += 2) {
    for (int64_t c = 4 * g; c < 4 * g + 4; ++c) {
      const float* w = panel + c * kPanel * 8;
      __m256 xv[R];
      GS_UNROLL for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * x_stride + c * 8);
      GS_UNROLL for (int j = 0; j < C; ++j) {
        const __m256 wv = _mm256_loadu_ps(w + j * 8);
        GS_UNROLL for (int r = 0; r < R; ++r) part[r][j] = _mm256_fmadd_ps(wv, xv[r], part[r][j]);
      }
    }
  }
}

template <int R, int C>
GS_AVX2 inline void tile_avx2(const float* x, int64_t x_stride, const float* panel,
                              int64_t chunks, float out[R][C]) {
  __m256 part0[R][C], part1[R][C];
  panel_sweep<R, C>(x, x_stride, panel, chunks / 4, 0, part0);
  panel_sweep<R, C>(x, x_stride, panel, chunks / 4, 1, part1);
  finish<R, C>(part0, part1, out);
}

// Fused tiles for few rows: each group of 32 weights of C weight rows is decoded in registers
// (F::group) and applied at once to all R activation rows, with no panel store.
template <class F, int R, int C>
GS_AVX2 inline void fused_group(const float* x, int64_t x_stride, const uint8_t* rows,
                                int64_t row_bytes, int64_t g, __m256 part[R][C]) {
  GS_UNROLL for (int j = 0; j < C; ++j) {
    __m256 w[4];
    F::group(rows + j * row_bytes, g, w);
    GS_UNROLL for (int i = 0; i < 4; ++i) {
      GS_UNROLL for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_loadu_ps(x + r * x_stride + g * 32 + i * 8);
        part[r][j] = _mm256_fmadd_ps(w[i], xv, part[r][j]);
      }
    }
  }
}

// Tiles with at most three outputs run both partials in one loop (two independent chains per
// output); larger ones sweep the even groups, then the odd ones. Each group is decoded once.
template <class F, int R, int C>
GS_AVX2 inline void fused_tile_avx2(const float* x, int64_t x_stride, const uint8_t* rows,
                                    int64_t row_bytes, int64_t K, float out[R][C]) {
  __m256 part0[R][C], part1[R][C];
  zero<R, C>(part0);
  zero<R, C>(part1);
  const int64_t groups = K / 32;
  if constexpr (R * C <= 3) {
    for (int64_t g = 0; g < groups; g += 2) {
      fused_group<F, R, C>(x, x_stride, rows, row_bytes, g, part0);
      if (g + 1 < groups) fused_group<F, R, C>(x, x_stride, rows, row_bytes, g + 1, part1);
    }
  } else {
    for (int64_t g = 0; g < groups; g += 2) {
      fused_group<F, R, C>(x, x_stride, rows, row_bytes, g, part0);
    }
    for (int64_t g = 1; g < groups; g += 2) {
      fused_group<F, R, C>(x, x_stride, rows, row_bytes, g, part1);
    }
  }
  finish<R, C>(part0, part1, out);
}

}  // namespace goodspeed
