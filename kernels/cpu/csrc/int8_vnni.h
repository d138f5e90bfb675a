// int8 activations on AVX-512 VNNI (vpdpbusd) for Q4_0, Q4_1 and Q8_0, over weights repacked once
// at load into tiles of 16 output columns (pack_tiles). Same values as the GGUF's blocks: the
// repack only moves bytes (Q8_0 also flips each byte's sign bit to store q + 128).
//
// Per row and group of 32 inputs, the 16 columns' dot products with the row's int8 values are
// exact int32 (vpdpbusd: unsigned weight bytes x signed activation bytes, four at a time):
//   Q4_0 (q - 8) and Q8_0 (q + 128 stored): isum = sum(stored * xq) - offset * sum(xq);
//   Q4_1: isum = sum(q * xq), plus m * (dx * sum(xq)) in float.
// Then y += (d * dx) * isum (+ m * sd) in float32, one group after another. A row's result
// depends on that row only, the same whatever M, the tile or the thread count.
//
// Tile layout, per group of 32 inputs (in order), 16 columns c:
//   d[16] fp16 (32 B) | Q4_1: m[16] fp16 (32 B) | Q4: 4 vectors of 64 B, Q8_0: 8 vectors of 64 B.
// Q4 vector j holds bytes 4j..4j+3 of column c's 16 nibble bytes at 4c..4c+3: low nibbles are
// inputs 4j..4j+3, high nibbles inputs 16+4j..16+4j+3. Q8_0 vector j holds column c's inputs
// 4j..4j+3. Either way the 4 bytes of vector j at column c pair with inputs 4j..4j+3 (the high
// nibbles of Q4 vector j act as vector j + 4).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "int8_drivers.h"

#define GS_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace goodspeed {

constexpr int64_t kTileCols = 16;

inline bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

inline bool tile_format(int64_t format) {
  return format == kQ4_0 || format == kQ4_1 || format == kQ8_0;
}

// Bytes of one tile's group (16 columns x 32 inputs): the 16 blocks' bytes, rearranged.
inline int64_t tile_group_bytes(int64_t format) { return kTileCols * block_shape(format).bytes; }

// Repacks the blocks of columns n0 .. n0 + 15 (row_bytes apart) into one tile of G groups.
inline void pack_tile16(const uint8_t* rows, int64_t row_bytes, int64_t format, int64_t G,
                           uint8_t* tile) {
  const int64_t bytes = block_shape(format).bytes, head = format == kQ4_1 ? 4 : 2;
  for (int64_t g = 0; g < G; ++g) {
    uint8_t* dst = tile + g * tile_group_bytes(format);
    for (int64_t c = 0; c < kTileCols; ++c) {
      const uint8_t* block = rows + c * row_bytes + g * bytes;
      std::memcpy(dst + 2 * c, block, 2);  // d
      if (format == kQ4_1) std::memcpy(dst + 32 + 2 * c, block + 2, 2);  // m
      const uint8_t* q = block + head;
      uint8_t* vectors = dst + 16 * head;
      for (int64_t j = 0; j < (bytes - head) / 4; ++j) {
        for (int t = 0; t < 4; ++t) {
          const uint8_t byte = q[4 * j + t];
          vectors[64 * j + 4 * c + t] = format == kQ8_0 ? (uint8_t)(byte ^ 0x80) : byte;
        }
      }
    }
  }
}

template <int64_t kFormat>
struct TileFormat {
  static constexpr bool kNibbles = kFormat != kQ8_0, kMin = kFormat == kQ4_1;
  static constexpr int kOffset = kFormat == kQ4_0 ? 8 : kFormat == kQ8_0 ? 128 : 0;
  static constexpr int64_t kQuants = kMin ? 64 : 32;  // where the weight vectors start
};

// Rows r0 .. r0 + R - 1 of x against one tile (16 columns): out[r][c].
template <int64_t kFormat, int R>
GS_VNNI inline void vnni_tile(const uint8_t* tile, const ActQ8& x, int64_t r0, float out[R][16]) {
  using F = TileFormat<kFormat>;
  __m512 acc[R];
  GS_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t group_bytes = tile_group_bytes(kFormat);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < x.G; ++g) {
    const uint8_t* b = tile + g * group_bytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
    __m512 m = _mm512_setzero_ps();
    if constexpr (F::kMin) m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 32)));
    __m512i w[8];
    GS_UNROLL for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(b + F::kQuants + 64 * j);
      if constexpr (F::kNibbles) {
        w[j] = _mm512_and_si512(v, low);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      } else {
        w[j] = v;
        w[j + 4] = _mm512_loadu_si512(b + F::kQuants + 64 * (j + 4));
      }
    }
    GS_UNROLL for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* xq = x.q + row * x.K + g * 32;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      GS_UNROLL for (int j = 0; j < 8; j += 2) {  // two chains: integer sums, order-free
        int32_t a, c;
        std::memcpy(&a, xq + 4 * j, 4);
        std::memcpy(&c, xq + 4 * j + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(a));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(c));
      }
      __m512i isum = _mm512_add_epi32(s0, s1);
      if constexpr (F::kOffset != 0) {
        isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(F::kOffset * x.sum[row * x.G + g]));
      }
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(x.d[row * x.G + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);
      if constexpr (F::kMin) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.sd[row * x.G + g]), acc[r]);
    }
  }
  GS_UNROLL for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

// Rows in chunks of up to eight against tiles [begin, end) of `packed` (tile_bytes apart).
template <int64_t kFormat>
void run_vnni_tiles(const Problem& p, const ActQ8& x, const uint8_t* packed, int64_t begin,
                    int64_t end) {
  const int64_t tile_bytes = x.G * tile_group_bytes(kFormat);
  for (int64_t tile = begin; tile < end; ++tile) {
    const uint8_t* weights = packed + tile * tile_bytes;
    for (int64_t r0 = 0; r0 < p.M; r0 += 8) {
      float res[8][16];
      switch (std::min<int64_t>(8, p.M - r0)) {
        case 1: vnni_tile<kFormat, 1>(weights, x, r0, res); break;
        case 2: vnni_tile<kFormat, 2>(weights, x, r0, res); break;
        case 3: vnni_tile<kFormat, 3>(weights, x, r0, res); break;
        case 4: vnni_tile<kFormat, 4>(weights, x, r0, res); break;
        case 5: vnni_tile<kFormat, 5>(weights, x, r0, res); break;
        case 6: vnni_tile<kFormat, 6>(weights, x, r0, res); break;
        case 7: vnni_tile<kFormat, 7>(weights, x, r0, res); break;
        case 8: vnni_tile<kFormat, 8>(weights, x, r0, res); break;
      }
      store<8, 16>(p, r0, tile * kTileCols, kTileCols, res, std::min<int64_t>(8, p.M - r0));
    }
  }
}

// The whole call: rows quantized once, tiles split over threads.
inline void run_vnni(const Problem& p, const uint8_t* packed) {
  const QuantizedRows rows(p.x, p.x_stride, p.M, p.K, true);
  at::parallel_for(0, p.N / kTileCols, 1, [&](int64_t begin, int64_t end) {
    switch (p.format) {
      case kQ4_0: run_vnni_tiles<kQ4_0>(p, rows.view, packed, begin, end); break;
      case kQ4_1: run_vnni_tiles<kQ4_1>(p, rows.view, packed, begin, end); break;
      case kQ8_0: run_vnni_tiles<kQ8_0>(p, rows.view, packed, begin, end); break;
    }
  });
}

}  // namespace goodspeed
