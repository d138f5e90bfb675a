// Drivers: how an (M x N) problem is cut into tiles (tiles.h). The cut never changes a result:
// every output element is computed with the one reduction order of tiles.h.
//  * fused (AVX2, M <= kMaxFused): each 32-weight group is decoded in registers and applied to
//    all M rows at once; weight memory is read once and nothing is stored but the outputs.
//  * panel (AVX2 for M > kMaxFused, and the scalar path): kPanel weight rows are dequantised
//    into a float32 scratch panel, then register tiles of up to 4 rows sweep it (twice: the
//    even groups, then the odd ones, tiles.h).
#pragma once

#include <algorithm>
#include <vector>

#include "dequant_avx2.h"
#include "dequant_scalar.h"
#include "tiles.h"

namespace goodspeed {

constexpr int kMaxFused = 8;

struct Problem {
  const float* x;
  int64_t x_stride, M, K, N;
  const uint8_t* blocks;
  int64_t row_bytes, format;
  const float* bias;  // nullptr: none
  float* out;
  int64_t out_stride;
};

template <int R, int C>
inline void store(const Problem& p, int64_t r0, int64_t n, int64_t cols, const float res[R][C],
                  int64_t rows = R) {
  for (int r = 0; r < std::min<int64_t>(R, rows); ++r) {
    float* out = p.out + (r0 + r) * p.out_stride + n;
    for (int64_t j = 0; j < std::min<int64_t>(C, cols); ++j) {
      out[j] = p.bias ? res[r][j] + p.bias[n + j] : res[r][j];
    }
  }
}

// ---- panel path ----
template <bool kAvx2, int R, int C>
void panel_rows(const Problem& p, const float* panel, int64_t r0, int64_t n0, int64_t cols) {
  for (int64_t j0 = 0; j0 < cols; j0 += C) {
    float res[R][C];
    const float* x = p.x + r0 * p.x_stride;
    if (kAvx2) {
      tile_avx2<R, C>(x, p.x_stride, panel + j0 * 8, p.K / 8, res);
    } else {
      tile_scalar<R, C>(x, p.x_stride, panel + j0 * 8, p.K / 8, res);
    }
    store<R, C>(p, r0, n0 + j0, cols - j0, res);
  }
}

// `dequant(row, K, dst, stride)` fills one panel column.
template <bool kAvx2, class Dequant>
void run_panel(const Problem& p, float* panel, int64_t n0, int64_t cols, Dequant dequant) {
  for (int64_t j = 0; j < cols; ++j) {
    dequant(p.blocks + (n0 + j) * p.row_bytes, p.K, panel + j * 8, (int64_t)kPanel * 8);
  }
  int64_t r0 = 0;
  for (; p.M - r0 >= 4; r0 += 4) panel_rows<kAvx2, 4, 3>(p, panel, r0, n0, cols);
  switch (p.M - r0) {
    case 3: panel_rows<kAvx2, 3, 4>(p, panel, r0, n0, cols); break;
    case 2: panel_rows<kAvx2, 2, 6>(p, panel, r0, n0, cols); break;
    case 1: panel_rows<kAvx2, 1, 12>(p, panel, r0, n0, cols); break;
  }
}

// ---- fused path ----
template <class F, int R, int C>
void fused_cols(const Problem& p, int64_t n0, int64_t cols) {
  int64_t j0 = 0;
  for (; cols - j0 >= C; j0 += C) {
    float res[R][C];
    fused_tile_avx2<F, R, C>(p.x, p.x_stride, p.blocks + (n0 + j0) * p.row_bytes, p.row_bytes,
                             p.K, res);
    store<R, C>(p, 0, n0 + j0, C, res);
  }
  for (; j0 < cols; ++j0) {  // a last, partial panel: one weight row at a time
    float res[R][1];
    fused_tile_avx2<F, R, 1>(p.x, p.x_stride, p.blocks + (n0 + j0) * p.row_bytes, p.row_bytes,
                             p.K, res);
    store<R, 1>(p, 0, n0 + j0, 1, res);
  }
}

// Weight rows per fused tile: about 8 independent accumulators within 16 ymm registers. Up to
// three outputs per tile, both partial sums run interleaved (tiles.h): one weight row at a time
// (wider single-row tiles spilled: measured slower).
template <class F>
void run_fused(const Problem& p, int64_t n0, int64_t cols) {
  switch (p.M) {
    case 1: fused_cols<F, 1, 1>(p, n0, cols); break;
    case 2: fused_cols<F, 2, 1>(p, n0, cols); break;
    case 3: fused_cols<F, 3, 1>(p, n0, cols); break;
    case 4: fused_cols<F, 4, 2>(p, n0, cols); break;
    case 5: fused_cols<F, 5, 1>(p, n0, cols); break;
    case 6: fused_cols<F, 6, 1>(p, n0, cols); break;
    case 7: fused_cols<F, 7, 1>(p, n0, cols); break;
    case 8: fused_cols<F, 8, 1>(p, n0, cols); break;
  }
}

// One scratch panel per thread, kept between calls; zero-filled when it grows so that the
// unused columns of a last, partial panel hold finite values.
inline float* thread_panel(int64_t K) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < (size_t)(kPanel * K)) scratch.assign(kPanel * K, 0.0f);
  return scratch.data();
}

template <class F>
void run_panels_avx2(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t n0 = i * kPanel, cols = std::min<int64_t>(kPanel, p.N - n0);
    if (p.M <= kMaxFused) {
      run_fused<F>(p, n0, cols);
    } else {
      run_panel<true>(p, thread_panel(p.K), n0, cols, dequant_row_avx2<F>);
    }
  }
}

inline void run_panels_scalar(const Problem& p, int64_t begin, int64_t end) {
  const int64_t format = p.format;
  auto dequant = [format](const uint8_t* row, int64_t K, float* dst, int64_t stride) {
    dequant_row_scalar(format, row, K, dst, stride);
  };
  for (int64_t i = begin; i < end; ++i) {
    const int64_t n0 = i * kPanel;
    run_panel<false>(p, thread_panel(p.K), n0, std::min<int64_t>(kPanel, p.N - n0), dequant);
  }
}

// Calls fn(F{}) with the format struct for `format` (already validated).
template <class Fn>
void with_format(int64_t format, Fn fn) {
  switch (format) {
    case kQ8_0: fn(Q8_0{}); break;
    case kQ4_0: fn(Q4_0{}); break;
    case kQ4_1: fn(Q4_1{}); break;
    case kQ5_0: fn(Q5_0{}); break;
    case kQ5_1: fn(Q5_1{}); break;
    case kQ4_K: fn(Q45_K<false>{}); break;
    case kQ5_K: fn(Q45_K<true>{}); break;
    case kQ6_K: fn(Q6_K{}); break;
  }
}

}  // namespace goodspeed
