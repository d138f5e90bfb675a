// The integer-activation tile kernels (qint_kernel.h) on AVX2: a tile runs as two halves of 8
// columns, a U8 plane half is one ymm. u8 x s8 products by maddubs (saturating pairs of int16:
// exact for weight bytes <= 63, every format's but Q8_0's, whose bytes are split into nibbles)
// then madd into int32, so the sums are exactly vpdpbusd's.
#include "qint.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>

namespace goodspeed {
namespace qint_avx2 {

struct V {
  static constexpr int kLanes = 8, kMaxRows = 2;
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
}  // namespace goodspeed

#define QINT_NS qint_avx2
#include "qint_kernel.h"
#undef QINT_NS

namespace goodspeed {
void qint_tiles_avx2(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  qint_avx2::run(job, t0, t1, r0, r1);
}
}  // namespace goodspeed

#pragma GCC pop_options
