// Tile kernels with integer activations (act_quant.h) over weights packed by tile_pack.h, one
// template for every ISA: a translation unit defines a vector type V and includes this file
// (qint_avx512.cpp, qint_avx2.cpp, qint_scalar.cpp), so the three paths run the same operations.
//
// The arithmetic, per output y[m, n] (m a row, n a column of one tile): every weight of a "unit"
// (inputs sharing one scale: a 32-input block, a K-quant sub-block, half a Q6_K group) is
// w = A * (u - o) + B, u an unsigned integer from the planes, o the format's integer offset, A
// and B per-column floats. With x ~ dx * q per activation group:
//     S = sum u * q, X = sum q            exact int32 (q = 256 hi + lo: two u8 x s8 products)
//     y = fma(A * dx, float(S - o * X), y)
//     y = fma(B, dx * float(X), y)        formats with a min (Q4_1, Q5_1; K-quants: B = -dmin*mn)
// units in input order, then out = y (+ bias). Integer sums are exact in any order and every
// float step is one rounding in a fixed order, so a row's output is the same bytes whatever M,
// the row chunk, the thread count or the ISA (AVX-512, AVX2 or scalar).
//
// V (16 columns per vector on AVX-512, scalar and AVX2's wide shape, 8 on AVX2's narrow shape,
// which runs a tile as two halves):
//   U8 (4 bytes a column), I32, F32; load, low4, high4, shift_mask, or8, dot (u <= 63), dot_full
//   (any byte), combine ((hi << 8) + lo), add, sub_scalar, cvt, fma, fnma, mul, set1, halves,
//   bytes_u8, bytes_i8, store, zero, zero_f; stream_ahead_bytes(a format's inputs per block)
//   (bytes a streaming call prefetches past the block it starts, 0: none), stream_rows() (the
//   most rows a call streams with, instead of prefetching the next tile); partial_depth(max
//   code) (0: products go straight into int32), and where it is not 0: P (narrow partial sums),
//   pzero, pdot, widen, keep (the sum pinned in a register), kRegs (registers per vector).
// No include guard: a translation unit may include it once per QINT_NS (qint_avx2.cpp twice).

#include <cstdint>

#include "act_quant.h"
#include "common.h"
#include "tile_pack.h"

namespace goodspeed {
namespace QINT_NS {

#define QI_UNROLL _Pragma("GCC unroll 16")

// Partial sums (a V whose products land in narrower sums, AVX2: maddubs's int16 pairs) that stay
// exact for kDepth plane pairs: each run of kDepth pairs is summed narrow, then widened into the
// int32 sums of plane a (kA: into sa) and of plane b (kB: into sb).
template <int R, bool kSplit, int P, int kDepth, bool kA, bool kB, class W, class Planes>
inline void partial_sums(const Acts& x, int64_t r0, int64_t ia, int64_t ib, Planes planes,
                         typename W::I32 sa[R], typename W::I32 sb[R]) {
  typename W::I32 ah[R], bh[R], al[R], bl[R];
  QI_UNROLL for (int p0 = 0; p0 < P; p0 += kDepth) {
    typename W::P ph[R], qh[R], pl[R], ql[R];
    QI_UNROLL for (int r = 0; r < R; ++r) ph[r] = qh[r] = pl[r] = ql[r] = W::pzero();
    QI_UNROLL for (int p = p0; p < (p0 + kDepth < P ? p0 + kDepth : P); ++p) {
      typename W::U8 ua, ub;
      planes(p, ua, ub);
      QI_UNROLL for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        if constexpr (kA) ph[r] = W::keep(W::pdot(ph[r], ua, x.hi_word(row, ia + 4 * p)));
        if constexpr (kB) qh[r] = W::keep(W::pdot(qh[r], ub, x.hi_word(row, ib + 4 * p)));
        if constexpr (kSplit && kA) pl[r] = W::keep(W::pdot(pl[r], ua, x.lo_word(row, ia + 4 * p)));
        if constexpr (kSplit && kB) ql[r] = W::keep(W::pdot(ql[r], ub, x.lo_word(row, ib + 4 * p)));
      }
    }
    QI_UNROLL for (int r = 0; r < R; ++r) {
      if constexpr (kA) ah[r] = p0 == 0 ? W::widen(ph[r]) : W::add(ah[r], W::widen(ph[r]));
      if constexpr (kB) bh[r] = p0 == 0 ? W::widen(qh[r]) : W::add(bh[r], W::widen(qh[r]));
      if constexpr (kSplit && kA) al[r] = p0 == 0 ? W::widen(pl[r]) : W::add(al[r], W::widen(pl[r]));
      if constexpr (kSplit && kB) bl[r] = p0 == 0 ? W::widen(ql[r]) : W::add(bl[r], W::widen(ql[r]));
    }
  }
  QI_UNROLL for (int r = 0; r < R; ++r) {
    if constexpr (kA) sa[r] = kSplit ? W::combine(ah[r], al[r]) : ah[r];
    if constexpr (kB) sb[r] = kSplit ? W::combine(bh[r], bl[r]) : bh[r];
  }
}

// dot_pairs on partial sums: the same integers, fewer instructions per product. Where the
// accumulators and a format's extra bit planes (codes past 15) would crowd the registers (more
// than ten: W::kRegs each, AVX2 has sixteen), plane a's sums come first, then plane b's (the
// pair's load repeated, an L1 hit), so half the accumulators are live at a time. Measured on
// AVX2 (docs/benchmarks.md §5o): 0.8-0.95x where this splits; splitting everywhere cost Q4_K
// int8 1.02-1.10x, splitting nowhere Q6_K int8 at several rows 1.1-1.4x.
template <int R, bool kSplit, int P, int kDepth, int kMaxCode, class W, class Planes>
inline void dot_pairs_partial(const Acts& x, int64_t r0, int64_t ia, int64_t ib, Planes planes,
                              typename W::I32 sa[R], typename W::I32 sb[R]) {
  constexpr int kAccumulators = (kSplit ? 2 : 1) * 2 * R, kExtraPlanes = kMaxCode > 15 ? 2 : 0;
  if constexpr ((kAccumulators + kExtraPlanes) * W::kRegs > 10) {
    partial_sums<R, kSplit, P, kDepth, true, false, W>(x, r0, ia, ib, planes, sa, sb);
    partial_sums<R, kSplit, P, kDepth, false, true, W>(x, r0, ia, ib, planes, sa, sb);
  } else {
    partial_sums<R, kSplit, P, kDepth, true, true, W>(x, r0, ia, ib, planes, sa, sb);
  }
}

// One pass over P plane pairs: plane a (inputs ia + 4p) and plane b (inputs ib + 4p) of each
// pair p, dotted with R rows' activations into sa[r], sb[r] (exact integer sums). kMaxCode: the
// largest weight code the planes hold (15, 31 or 63; Q8_0's full bytes take the kFull path).
template <int R, bool kSplit, bool kFull, int P, int kMaxCode, class Planes>
inline void dot_pairs(const Acts& x, int64_t r0, int64_t ia, int64_t ib, Planes planes,
                      V::I32 sa[R], V::I32 sb[R]) {
  if constexpr (!kFull && V::partial_depth(kMaxCode) > 0) {
    return dot_pairs_partial<R, kSplit, P, V::partial_depth(kMaxCode), kMaxCode, V>(
        x, r0, ia, ib, planes, sa, sb);
  }
  V::I32 ah[R], bh[R], al[R], bl[R];
  QI_UNROLL for (int r = 0; r < R; ++r) ah[r] = bh[r] = al[r] = bl[r] = V::zero();
  QI_UNROLL for (int p = 0; p < P; ++p) {
    V::U8 ua, ub;
    planes(p, ua, ub);
    QI_UNROLL for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      ah[r] = V::template dot<kFull>(ah[r], ua, x.hi_word(row, ia + 4 * p));
      bh[r] = V::template dot<kFull>(bh[r], ub, x.hi_word(row, ib + 4 * p));
      if constexpr (kSplit) {
        al[r] = V::template dot<kFull>(al[r], ua, x.lo_word(row, ia + 4 * p));
        bl[r] = V::template dot<kFull>(bl[r], ub, x.lo_word(row, ib + 4 * p));
      }
    }
  }
  QI_UNROLL for (int r = 0; r < R; ++r) {
    sa[r] = kSplit ? V::combine(ah[r], al[r]) : ah[r];
    sb[r] = kSplit ? V::combine(bh[r], bl[r]) : bh[r];
  }
}

// y += (A * dx) * float(S - o * X)
inline V::F32 scaled_sum(V::F32 y, V::F32 a, float dx, V::I32 s, int32_t offset_x) {
  return V::fma(V::mul(a, V::set1(dx)), V::cvt(V::sub_scalar(s, offset_x)), y);
}

// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: one unit per 32-input block.
template <int64_t kFormat>
struct Small {
  static constexpr int64_t kElems = 32;
  static constexpr bool kMin = kFormat == kQ4_1 || kFormat == kQ5_1;
  static constexpr bool kFive = kFormat == kQ5_0 || kFormat == kQ5_1;
  static constexpr bool kFull = kFormat == kQ8_0;
  static constexpr int kMaxCode = kFull ? 255 : kFive ? 31 : 15;
  static constexpr int32_t kOffset = kFormat == kQ8_0 ? 128 : kFormat == kQ4_0 ? 8
                                     : kFormat == kQ5_0 ? 16 : 0;

  template <int R, bool kSplit>
  static void block(const uint8_t* blk, int c0, const Acts& x, int64_t r0, int64_t b,
                    V::F32 y[R]) {
    const V::F32 d = V::halves(blk + 2 * c0);
    const uint8_t* planes = blk + (kMin ? 64 : 32) + 4 * c0;
    const V::U8 fifth = kFive ? V::load(planes + 256) : V::U8{};
    V::I32 sa[R], sb[R];
    dot_pairs<R, kSplit, kFull, 4, kMaxCode>(x, r0, 32 * b, 32 * b + 16, [&](int p, V::U8& ua, V::U8& ub) {
      if constexpr (kFull) {
        ua = V::load(planes + 64 * p);
        ub = V::load(planes + 64 * (p + 4));
      } else {
        const V::U8 w = V::load(planes + 64 * p);
        ua = V::low4(w);
        ub = V::high4(w);
        if constexpr (kFive) {
          ua = V::or8(ua, V::shift_mask(fifth, 4 - p, 0x10));
          ub = V::or8(ub, V::shift_mask(fifth, -p, 0x10));
        }
      }
    }, sa, sb);
    QI_UNROLL for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const float dx = x.scale(row, b);
      const int32_t sum = x.sum(row, 2 * b) + x.sum(row, 2 * b + 1);
      y[r] = scaled_sum(y[r], d, dx, V::add(sa[r], sb[r]), kOffset * sum);
      if constexpr (kMin) {
        y[r] = V::fma(V::halves(blk + 32 + 2 * c0), V::set1(x.scaled_group_sum(row, b)), y[r]);
      }
    }
  }
};

// Q4_K (kFive = false) and Q5_K: a super-block of 8 sub-blocks, A = d * sc, B = -dmin * mn.
template <bool kFive>
struct K45 {
  static constexpr int64_t kElems = 256;
  static constexpr int64_t kPairBytes = kFive ? 640 : 512;

  template <int R, bool kSplit>
  static void block(const uint8_t* blk, int c0, const Acts& x, int64_t r0, int64_t b,
                    V::F32 y[R]) {
    const V::F32 d = V::halves(blk + 2 * c0), dmin = V::halves(blk + 32 + 2 * c0);
    for (int j = 0; j < 4; ++j) {
      const uint8_t* planes = blk + 320 + j * kPairBytes + 4 * c0;
      const V::U8 f0 = kFive ? V::load(planes + 512) : V::U8{};
      const V::U8 f1 = kFive ? V::load(planes + 576) : V::U8{};
      V::I32 s[2][R];
      const int64_t base = 256 * b + 64 * j;
      dot_pairs<R, kSplit, false, 8, kFive ? 31 : 15>(x, r0, base, base + 32, [&](int v, V::U8& ua, V::U8& ub) {
        const V::U8 w = V::load(planes + 64 * v);
        ua = V::low4(w);
        ub = V::high4(w);
        if constexpr (kFive) {
          const V::U8 f = v < 4 ? f0 : f1;
          ua = V::or8(ua, V::shift_mask(f, 4 - v % 4, 0x10));
          ub = V::or8(ub, V::shift_mask(f, -(v % 4), 0x10));
        }
      }, s[0], s[1]);
      for (int half = 0; half < 2; ++half) {
        const int unit = 2 * j + half;
        const V::F32 a = V::mul(d, V::bytes_u8(blk + 64 + 16 * unit + c0));
        const V::F32 m = V::mul(dmin, V::bytes_u8(blk + 192 + 16 * unit + c0));
        QI_UNROLL for (int r = 0; r < R; ++r) {
          const int64_t row = r0 + r, group = 8 * b + unit;
          y[r] = scaled_sum(y[r], a, x.scale(row, group), s[half][r], 0);
          y[r] = V::fnma(m, V::set1(x.scaled_group_sum(row, group)), y[r]);
        }
      }
    }
  }
};

// Q6_K: 8 groups of 32 inputs, each two units of 16 with int8 scales; w = d * sc * (u - 32).
struct Q6K {
  static constexpr int64_t kElems = 256;

  template <int R, bool kSplit>
  static void block(const uint8_t* blk, int c0, const Acts& x, int64_t r0, int64_t b,
                    V::F32 y[R]) {
    const V::F32 d = V::halves(blk + 2 * c0);
    for (int g = 0; g < 8; ++g) {
      const uint8_t* planes = blk + 288 + 384 * g + 4 * c0;
      const V::U8 top0 = V::load(planes + 256), top1 = V::load(planes + 320);
      V::I32 s[2][R];
      const int64_t base = 256 * b + 32 * g;
      dot_pairs<R, kSplit, false, 4, 63>(x, r0, base, base + 16, [&](int v, V::U8& ua, V::U8& ub) {
        const V::U8 w = V::load(planes + 64 * v);
        ua = V::or8(V::low4(w), V::shift_mask(top0, 4 - 2 * v, 0x30));
        ub = V::or8(V::high4(w), V::shift_mask(top1, 4 - 2 * v, 0x30));
      }, s[0], s[1]);
      for (int half = 0; half < 2; ++half) {
        const V::F32 a = V::mul(d, V::bytes_i8(blk + 32 + 16 * (2 * g + half) + c0));
        QI_UNROLL for (int r = 0; r < R; ++r) {
          const int64_t row = r0 + r;
          const float dx = x.scale(row, 8 * b + g);
          y[r] = scaled_sum(y[r], a, dx, s[half][r], 32 * x.sum(row, 16 * b + 2 * g + half));
        }
      }
    }
  }
};

// Asks for block b of the next tile into L2 while this tile's block b computes: with several
// rows a tile is compute-bound long enough for the hardware prefetcher to fall behind, and the
// next tile's bytes would otherwise arrive only when it starts (measured: 20-30% at M = 2..8).
inline void prefetch_block(const uint8_t* next, int64_t block_bytes) {
  for (int64_t at = 0; at < block_bytes; at += 64) __builtin_prefetch(next + at, 0, 2);
}

// A call of few rows streams the weights once and is bound by memory: the hardware prefetcher
// alone leaves the core waiting at each new run of lines, so each block also asks for the lines
// `ahead` bytes past itself into L1 (prefetcht0). Measured on AVX2 at one row, one 1536 x 286720
// layer from DRAM, two threads (docs/benchmarks.md §5s): 1.03-1.14x the bytes per second.
inline void stream_ahead(const uint8_t* block, int64_t block_bytes, int64_t ahead) {
  for (int64_t at = ahead; at < block_bytes + ahead; at += 64) __builtin_prefetch(block + at, 0, 3);
}

// Rows r0 .. r0 + R - 1 against one tile: res[r][c] for the tile's 16 columns. `next`: the tile
// to prefetch meanwhile (nullptr: none); `stream`: the first pass of a call of few rows
// (stream_ahead).
template <class F, int R, bool kSplit>
inline void tile_rows(const uint8_t* tile, const uint8_t* next, bool stream, int64_t block_bytes,
                      const Acts& x, int64_t r0, float res[R][16]) {
  constexpr int64_t kAhead = V::stream_ahead_bytes(F::kElems);
  for (int c0 = 0; c0 < 16; c0 += V::kLanes) {
    V::F32 y[R];
    QI_UNROLL for (int r = 0; r < R; ++r) y[r] = V::zero_f();
    for (int64_t b = 0; b < x.K / F::kElems; ++b) {
      if (next != nullptr && c0 == 0) prefetch_block(next + b * block_bytes, block_bytes);
      const uint8_t* block = tile + b * block_bytes;
      if (kAhead > 0 && stream && c0 == 0) stream_ahead(block, block_bytes, kAhead);
      F::template block<R, kSplit>(block, c0, x, r0, b, y);
    }
    QI_UNROLL for (int r = 0; r < R; ++r) V::store(res[r] + c0, y[r]);
  }
}

// Rows in passes of at most kMaxRows, as even as they go (5 rows: 3 + 2, not 4 + 1: a lone row
// is latency-bound and costs nearly a whole pass).
template <class F, bool kSplit>
inline void run_tiles(const QintJob& job, int64_t tile_begin, int64_t tile_end, int64_t row_begin,
                      int64_t row_end) {
  const int64_t block_bytes = tile_block_bytes(job.format);
  const int64_t stride = tile_bytes(job.format, job.x.K);
  const int64_t passes = (row_end - row_begin + V::kMaxRows - 1) / V::kMaxRows;
  // Up to V::stream_rows() rows a call is bound by memory and its first pass streams ahead into L1
  // (stream_ahead); with more, each tile computes long enough that the next is asked into L2
  // meanwhile (prefetch_block).
  const bool stream = row_end - row_begin <= V::stream_rows(), fetch = !stream;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const uint8_t* weights = job.packed + tile * stride;
    const uint8_t* next = fetch && tile + 1 < tile_end ? weights + stride : nullptr;
    for (int64_t r0 = row_begin, pass = 0; r0 < row_end; ++pass) {
      float res[V::kMaxRows][16];
      const int64_t rows = (row_end - r0 + passes - pass - 1) / (passes - pass);
      const uint8_t* ahead = r0 == row_begin ? next : nullptr;
      const bool first = stream && r0 == row_begin;
      switch (rows) {
        case 1: tile_rows<F, 1, kSplit>(weights, ahead, first, block_bytes, job.x, r0, (float(*)[16])res); break;
        case 2: tile_rows<F, 2, kSplit>(weights, ahead, first, block_bytes, job.x, r0, (float(*)[16])res); break;
        case 3: if constexpr (V::kMaxRows >= 3) tile_rows<F, 3, kSplit>(weights, ahead, first, block_bytes, job.x, r0, (float(*)[16])res); break;
        case 4: if constexpr (V::kMaxRows >= 4) tile_rows<F, 4, kSplit>(weights, ahead, first, block_bytes, job.x, r0, (float(*)[16])res); break;
      }
      job.store(res, r0, rows, tile);
      r0 += rows;
    }
  }
}

template <bool kSplit>
inline void run_format(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  switch (job.format) {
    case kQ8_0: return run_tiles<Small<kQ8_0>, kSplit>(job, t0, t1, r0, r1);
    case kQ4_0: return run_tiles<Small<kQ4_0>, kSplit>(job, t0, t1, r0, r1);
    case kQ4_1: return run_tiles<Small<kQ4_1>, kSplit>(job, t0, t1, r0, r1);
    case kQ5_0: return run_tiles<Small<kQ5_0>, kSplit>(job, t0, t1, r0, r1);
    case kQ5_1: return run_tiles<Small<kQ5_1>, kSplit>(job, t0, t1, r0, r1);
    case kQ4_K: return run_tiles<K45<false>, kSplit>(job, t0, t1, r0, r1);
    case kQ5_K: return run_tiles<K45<true>, kSplit>(job, t0, t1, r0, r1);
    case kQ6_K: return run_tiles<Q6K, kSplit>(job, t0, t1, r0, r1);
  }
}

// The ISA's entry point (qint.h): tiles [t0, t1) x rows [r0, r1) of one job.
inline void run(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  if (job.x.lo != nullptr) return run_format<true>(job, t0, t1, r0, r1);
  run_format<false>(job, t0, t1, r0, r1);
}

#undef QI_UNROLL

}  // namespace QINT_NS
}  // namespace goodspeed
