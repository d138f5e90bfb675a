// float32 activations on the tiles of tile_pack.h (16 output columns, weights as stored, bytes
// moved), with AVX-512: each 32-bit lane of a weight vector is one column, so one FMA applies
// one input to 16 columns, and the decode is two integer ops per 16 weights.
//
// Effective weights are exactly gguf's: d * q + m with q a small integer and d, m from fp16,
// whose product is exact in float32, so fmadd rounds once, as numpy's multiply-then-add does
// (Q4_0: d * q + (-8 d); Q8_0: q + 128 is stored, d * u + (-128 d)). Each output is four partial
// sums over the inputs k = t (mod 4) of every group, in order, then (p0 + p1) + (p2 + p3): one
// order whatever M, the row chunk or the thread count, so a row is bitwise the same alone or in
// any batch.
#pragma once

#include <immintrin.h>

#include "drivers.h"
#include "qint.h"

#define GS_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace goodspeed {

// The three formats with float32 tile paths, and where their weight planes start in a block.
inline bool f32_tile_format(int64_t format) {
  return format == kQ4_0 || format == kQ4_1 || format == kQ8_0;
}

template <int64_t kFormat>
struct TileFormat {
  static constexpr bool kNibbles = kFormat != kQ8_0, kMin = kFormat == kQ4_1;
  static constexpr int kOffset = kFormat == kQ4_0 ? 8 : kFormat == kQ8_0 ? 128 : 0;
  static constexpr int64_t kQuants = kMin ? 64 : 32;  // where the weight vectors start
};

// The weights of inputs 4j + t (and, for nibbles, 16 + 4j + t) of one group, for 16 columns.
template <int64_t kFormat>
GS_VNNI inline __m512 lane_weights(__m512i v, int shift, __m512 d, __m512 m) {
  __m512i q = _mm512_srli_epi32(v, shift);
  q = _mm512_and_si512(q, _mm512_set1_epi32(TileFormat<kFormat>::kNibbles ? 0x0F : 0xFF));
  return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(q), m);
}

// Rows r0 .. r0 + R - 1 (R <= kF32Rows) of x against one tile: out[r][c].
template <int64_t kFormat, int R>
GS_VNNI inline void f32_tile(const uint8_t* tile, const float* x, int64_t x_stride, int64_t r0,
                             int64_t G, float out[R][16]) {
  using F = TileFormat<kFormat>;
  __m512 acc[R][4];
  GS_UNROLL for (int r = 0; r < R; ++r) {
    GS_UNROLL for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const int64_t group_bytes = tile_block_bytes(kFormat);
  constexpr int kVectors = F::kNibbles ? 4 : 8;
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b = tile + g * group_bytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
    __m512 m;
    if constexpr (F::kMin) {
      m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 32)));
    } else {
      m = _mm512_mul_ps(d, _mm512_set1_ps(-(float)F::kOffset));
    }
    const float* xg = x + r0 * x_stride + g * 32;
    GS_UNROLL for (int j = 0; j < kVectors; ++j) {
      const __m512i v = _mm512_loadu_si512(b + F::kQuants + 64 * j);
      GS_UNROLL for (int t = 0; t < 4; ++t) {
        const __m512 w = lane_weights<kFormat>(v, 8 * t, d, m);
        GS_UNROLL for (int r = 0; r < R; ++r) {
          acc[r][t] = _mm512_fmadd_ps(w, _mm512_set1_ps(xg[r * x_stride + 4 * j + t]), acc[r][t]);
        }
        if constexpr (F::kNibbles) {  // the high nibbles: inputs 16 + 4j + t
          const __m512 high = lane_weights<kFormat>(v, 8 * t + 4, d, m);
          GS_UNROLL for (int r = 0; r < R; ++r) {
            acc[r][t] =
                _mm512_fmadd_ps(high, _mm512_set1_ps(xg[r * x_stride + 16 + 4 * j + t]), acc[r][t]);
          }
        }
      }
    }
  }
  GS_UNROLL for (int r = 0; r < R; ++r) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                     _mm512_add_ps(acc[r][2], acc[r][3]));
    _mm512_storeu_ps(out[r], sum);
  }
}

// Rows per pass over a tile: 4 x 6 accumulators and the weight vectors fit 32 registers.
constexpr int64_t kF32Rows = 6;

template <int64_t kFormat>
void run_f32_tiles(const Problem& p, const uint8_t* packed, int64_t begin, int64_t end) {
  const int64_t G = p.K / 32, tile_bytes = G * tile_block_bytes(kFormat);
  for (int64_t tile = begin; tile < end; ++tile) {
    const uint8_t* weights = packed + tile * tile_bytes;
    for (int64_t r0 = 0; r0 < p.M; r0 += kF32Rows) {
      float res[kF32Rows][16];
      const int64_t rows = std::min(kF32Rows, p.M - r0);
      switch (rows) {
        case 1: f32_tile<kFormat, 1>(weights, p.x, p.x_stride, r0, G, res); break;
        case 2: f32_tile<kFormat, 2>(weights, p.x, p.x_stride, r0, G, res); break;
        case 3: f32_tile<kFormat, 3>(weights, p.x, p.x_stride, r0, G, res); break;
        case 4: f32_tile<kFormat, 4>(weights, p.x, p.x_stride, r0, G, res); break;
        case 5: f32_tile<kFormat, 5>(weights, p.x, p.x_stride, r0, G, res); break;
        case 6: f32_tile<kFormat, 6>(weights, p.x, p.x_stride, r0, G, res); break;
      }
      store<kF32Rows, 16>(p, r0, tile * kTileCols, kTileCols, res, rows);
    }
  }
}

inline void run_f32_packed(const Problem& p, const uint8_t* packed) {
  at::parallel_for(0, p.N / kTileCols, 1, [&](int64_t begin, int64_t end) {
    switch (p.format) {
      case kQ4_0: run_f32_tiles<kQ4_0>(p, packed, begin, end); break;
      case kQ4_1: run_f32_tiles<kQ4_1>(p, packed, begin, end); break;
      case kQ8_0: run_f32_tiles<kQ8_0>(p, packed, begin, end); break;
    }
  });
}

}  // namespace goodspeed
