// The integer-activation tile kernels (qint_kernel.h) on AVX-512 with VNNI: a U8 plane is one
// zmm (16 columns x 4 bytes), products by vpdpbusd (u8 x s8, four per 32-bit lane, no
// saturation). Only called where cpu_has_avx512().
#include "qint.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

#include <immintrin.h>

namespace goodspeed {
namespace qint_avx512 {

struct V {
  static constexpr int kLanes = 16, kMaxRows = 4;
  // Calls of up to stream_rows() rows stream (qint_kernel.h), the others prefetch the next tile
  // into L2. On AMD up to 2: measured on Zen 5, the Qwen 1.5B's layers at two threads
  // (docs/benchmarks.md §5zb), whose memory runs at ~50 or ~70 GB/s by turns: at 2 rows
  // 0.83-0.86x the time of the next tile's L2 prefetch at the lower speed, 1.03x at the higher;
  // at 3 and 4 rows 0.86-0.95x at the lower and 1.12-1.14x at the higher, a loss. On Intel none:
  // measured on a 2-core Xeon (260 MB L3), the prefetch took SmolLM2's layers to 0.77x / 0.75x
  // the time at 1 / 2 rows (int16) and the Qwen 1.5B's to 0.95x / 0.96x, the same beyond
  // (docs/benchmarks.md §5zm).
  static int stream_rows() { return cpu_is_intel() ? 0 : 2; }
  // One-row calls (qint_kernel.h's stream_ahead) on the K-quants' 256-input blocks only.
  // Measured on Zen 5, one 1536 x 286720 layer from DRAM, two threads (docs/benchmarks.md
  // §5za): Q4_K and Q6_K int16 1.07-1.10x the bytes per second at 2048; Q5_0 and Q8_0 no
  // better at any distance, mostly worse (their blocks are 8x smaller).
  static constexpr int64_t stream_ahead_bytes(int64_t block_elems) {
    return block_elems == 256 ? 2048 : 0;
  }
  using U8 = __m512i;
  using I32 = __m512i;
  using F32 = __m512;

  // One load per plane: without the barrier the compiler folds the load into both the low and
  // the high nibble's instruction, and a pass of several rows is bound by loads and instructions
  // issued, not products. Measured on Zen 5 (docs/benchmarks.md §5zb): one thread, layers in
  // cache, 1.03-1.27x at M >= 2; the 1.5B's layers at two threads ~1.04x at M = 5, ~1.0x else.
  static U8 load(const uint8_t* p) {
    U8 v = _mm512_loadu_si512(p);
    __asm__("" : "+v"(v));
    return v;
  }
  static U8 low4(U8 v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static U8 high4(U8 v) { return low4(_mm512_srli_epi16(v, 4)); }
  // (v << n) & mask per byte (n < 0: a right shift); the masks keep bits of the same byte.
  static U8 shift_mask(U8 v, int n, uint8_t mask) {
    const __m512i s = n >= 0 ? _mm512_sll_epi16(v, _mm_cvtsi32_si128(n))
                             : _mm512_srl_epi16(v, _mm_cvtsi32_si128(-n));
    return _mm512_and_si512(s, _mm512_set1_epi8((char)mask));
  }
  static U8 or8(U8 a, U8 b) { return _mm512_or_si512(a, b); }
  static I32 zero() { return _mm512_setzero_si512(); }
  template <bool kFull>
  static I32 dot(I32 acc, U8 u, int32_t x4) {
    return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x4));
  }
  static constexpr int partial_depth(int) { return 0; }  // vpdpbusd sums into int32 directly
  static I32 combine(I32 hi, I32 lo) { return _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo); }
  static I32 add(I32 a, I32 b) { return _mm512_add_epi32(a, b); }
  static I32 sub_scalar(I32 a, int32_t s) { return _mm512_sub_epi32(a, _mm512_set1_epi32(s)); }
  static F32 cvt(I32 a) { return _mm512_cvtepi32_ps(a); }
  static F32 zero_f() { return _mm512_setzero_ps(); }
  static F32 fma(F32 a, F32 b, F32 c) { return _mm512_fmadd_ps(a, b, c); }
  static F32 fnma(F32 a, F32 b, F32 c) { return _mm512_fnmadd_ps(a, b, c); }
  static F32 mul(F32 a, F32 b) { return _mm512_mul_ps(a, b); }
  static F32 set1(float v) { return _mm512_set1_ps(v); }
  static F32 halves(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
  static F32 bytes_u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static F32 bytes_i8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static void store(float* out, F32 v) { _mm512_storeu_ps(out, v); }
};

}  // namespace qint_avx512
}  // namespace goodspeed

#define QINT_NS qint_avx512
#include "qint_kernel.h"
#undef QINT_NS

namespace goodspeed {
void qint_tiles_avx512(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  qint_avx512::run(job, t0, t1, r0, r1);
}
}  // namespace goodspeed

#pragma GCC pop_options
