// The integer-activation tile kernels (qint_kernel.h) on AVX2, in two shapes: qint_avx2 runs a
// tile as two halves of 8 columns (a U8 plane half is one ymm), qint_avx2_wide 16 columns at a
// time (two ymm); qint_tiles_avx2 picks per call. u8 x s8 products by maddubs (saturating pairs
// of int16: exact for weight bytes <= 63, every format's but Q8_0's, whose bytes are split into
// nibbles) then madd into int32, so the sums are exactly vpdpbusd's. Codes of at most 6 bits add
// their maddubs pairs as int16 for a few plane pairs before one madd (partial sums).
#include "qint.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>

namespace goodspeed {
namespace qint_avx2 {

struct V {
  static constexpr int kLanes = 8, kMaxRows = 2, kRegs = 1;  // kRegs: ymm per vector
  // One-row calls stream; streaming at 2 and 3 rows was slower on Zen 5's AVX2 path (§5zb).
  static int stream_rows() { return 1; }
  // One-row calls (qint_kernel.h's stream_ahead), every format (docs/benchmarks.md §5s).
  static constexpr int64_t stream_ahead_bytes(int64_t) { return 768; }
  using U8 = __m256i;
  using I32 = __m256i;
  using F32 = __m256;

  static U8 load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static U8 low4(U8 v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static U8 high4(U8 v) { return low4(_mm256_srli_epi16(v, 4)); }
  static U8 shift_mask(U8 v, int n, uint8_t mask) {
    const __m256i s = n >= 0 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(n))
                             : _mm256_srl_epi16(v, _mm_cvtsi32_si128(-n));
    return _mm256_and_si256(s, _mm256_set1_epi8((char)mask));
  }
  static U8 or8(U8 a, U8 b) { return _mm256_or_si256(a, b); }
  static I32 zero() { return _mm256_setzero_si256(); }
  // Sum of four u8 x s8 products per 32-bit lane; u <= 63 keeps maddubs from saturating.
  static I32 dot_small(U8 u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
  }
  template <bool kFull>
  static I32 dot(I32 acc, U8 u, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    if constexpr (!kFull) return _mm256_add_epi32(acc, dot_small(u, x));
    const __m256i high = _mm256_slli_epi32(dot_small(high4(u), x), 4);
    return _mm256_add_epi32(acc, _mm256_add_epi32(high, dot_small(low4(u), x)));
  }
  // Partial sums (qint_kernel.h's dot_pairs_partial): maddubs's int16 pairs added as int16, exact
  // while |sum| <= depth * 2 * 128 * max_code <= 32767, then madd'ed into int32 once.
  using P = __m256i;
  static constexpr int partial_depth(int max_code) { return 32767 / (256 * max_code); }
  static P pzero() { return _mm256_setzero_si256(); }
  static P pdot(P acc, U8 u, int32_t x4) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, _mm256_set1_epi32(x4)));
  }
  static I32 widen(P p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }
  // The sum as it stands, in a register: GCC would otherwise hoist every product and spill.
  static P keep(P p) {
    __asm__("" : "+x"(p));
    return p;
  }
  static I32 combine(I32 hi, I32 lo) { return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo); }
  static I32 add(I32 a, I32 b) { return _mm256_add_epi32(a, b); }
  static I32 sub_scalar(I32 a, int32_t s) { return _mm256_sub_epi32(a, _mm256_set1_epi32(s)); }
  static F32 cvt(I32 a) { return _mm256_cvtepi32_ps(a); }
  static F32 zero_f() { return _mm256_setzero_ps(); }
  static F32 fma(F32 a, F32 b, F32 c) { return _mm256_fmadd_ps(a, b, c); }
  static F32 fnma(F32 a, F32 b, F32 c) { return _mm256_fnmadd_ps(a, b, c); }
  static F32 mul(F32 a, F32 b) { return _mm256_mul_ps(a, b); }
  static F32 set1(float v) { return _mm256_set1_ps(v); }
  static F32 halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static F32 bytes_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static F32 bytes_i8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static void store(float* out, F32 v) { _mm256_storeu_ps(out, v); }
};

}  // namespace qint_avx2

// The same kernels 16 columns at a time: each activation word is broadcast once for both halves
// of a tile, at the price of twice the registers per accumulator (docs/benchmarks.md §5o).
namespace qint_avx2_wide {

// Two ymm make one 16-column vector; every operation is the 8-column one on each half (the
// shared activation broadcast is computed once: the same expression, merged by the compiler).
struct Y2 {
  __m256i a, b;
};
struct F2 {
  __m256 a, b;
};

struct V {
  using N = qint_avx2::V;
  static constexpr int kLanes = 16, kMaxRows = 2, kRegs = 2;
  static int stream_rows() { return N::stream_rows(); }
  static constexpr int64_t stream_ahead_bytes(int64_t e) { return N::stream_ahead_bytes(e); }
  using U8 = Y2;
  using I32 = Y2;
  using F32 = F2;
  using P = Y2;

  static U8 load(const uint8_t* p) { return {N::load(p), N::load(p + 32)}; }
  static U8 low4(U8 v) { return {N::low4(v.a), N::low4(v.b)}; }
  static U8 high4(U8 v) { return {N::high4(v.a), N::high4(v.b)}; }
  static U8 shift_mask(U8 v, int n, uint8_t mask) {
    return {N::shift_mask(v.a, n, mask), N::shift_mask(v.b, n, mask)};
  }
  static U8 or8(U8 x, U8 y) { return {N::or8(x.a, y.a), N::or8(x.b, y.b)}; }
  static I32 zero() { return {N::zero(), N::zero()}; }
  template <bool kFull>
  static I32 dot(I32 acc, U8 u, int32_t x4) {
    return {N::dot<kFull>(acc.a, u.a, x4), N::dot<kFull>(acc.b, u.b, x4)};
  }
  static constexpr int partial_depth(int max_code) { return N::partial_depth(max_code); }
  static P pzero() { return {N::pzero(), N::pzero()}; }
  static P pdot(P acc, U8 u, int32_t x4) { return {N::pdot(acc.a, u.a, x4), N::pdot(acc.b, u.b, x4)}; }
  static I32 widen(P p) { return {N::widen(p.a), N::widen(p.b)}; }
  static P keep(P p) { return {N::keep(p.a), N::keep(p.b)}; }
  static I32 combine(I32 hi, I32 lo) { return {N::combine(hi.a, lo.a), N::combine(hi.b, lo.b)}; }
  static I32 add(I32 x, I32 y) { return {N::add(x.a, y.a), N::add(x.b, y.b)}; }
  static I32 sub_scalar(I32 x, int32_t s) { return {N::sub_scalar(x.a, s), N::sub_scalar(x.b, s)}; }
  static F32 cvt(I32 x) { return {N::cvt(x.a), N::cvt(x.b)}; }
  static F32 zero_f() { return {N::zero_f(), N::zero_f()}; }
  static F32 fma(F32 x, F32 y, F32 z) { return {N::fma(x.a, y.a, z.a), N::fma(x.b, y.b, z.b)}; }
  static F32 fnma(F32 x, F32 y, F32 z) { return {N::fnma(x.a, y.a, z.a), N::fnma(x.b, y.b, z.b)}; }
  static F32 mul(F32 x, F32 y) { return {N::mul(x.a, y.a), N::mul(x.b, y.b)}; }
  static F32 set1(float v) { return {N::set1(v), N::set1(v)}; }
  static F32 halves(const uint8_t* p) { return {N::halves(p), N::halves(p + 16)}; }
  static F32 bytes_u8(const uint8_t* p) { return {N::bytes_u8(p), N::bytes_u8(p + 8)}; }
  static F32 bytes_i8(const uint8_t* p) { return {N::bytes_i8(p), N::bytes_i8(p + 8)}; }
  static void store(float* out, F32 v) {
    N::store(out, v.a);
    N::store(out + 8, v.b);
  }
};

}  // namespace qint_avx2_wide
}  // namespace goodspeed

#define QINT_NS qint_avx2
#include "qint_kernel.h"
#undef QINT_NS

#define QINT_NS qint_avx2_wide
#include "qint_kernel.h"
#undef QINT_NS

namespace goodspeed {
void qint_tiles_avx2(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  // Measured per format, activation mode and row count (docs/benchmarks.md §5o): the 16-column
  // pass is 0.72-0.92x the 8-column one at one row for every format; at several rows 0.79-1.0x
  // for most, about even for Q6_K (0.94-1.05x) and int16 Q4_K (0.87-1.06x), worse for Q5_K
  // (1.04-1.28x), mixed for Q8_0 (0.89-1.08x): those two keep 8 columns at several rows.
  const bool wide = r1 - r0 == 1 || !(job.format == kQ5_K || job.format == kQ8_0);
  if (wide) return qint_avx2_wide::run(job, t0, t1, r0, r1);
  qint_avx2::run(job, t0, t1, r0, r1);
}
}  // namespace goodspeed

#pragma GCC pop_options
