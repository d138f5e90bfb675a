// Vectorised elementwise maths for the decode-step ops (AVX2 + FMA).
#pragma once

#include <immintrin.h>

#define GS_AVX2_FMA __attribute__((target("avx2,fma,f16c")))

namespace goodspeed {

// e^x for x <= 0 (scores minus their max) to ~2 ulp (Cephes' expf polynomial); 0 below -87,
// -inf included.
GS_AVX2_FMA inline __m256 exp_nonpositive(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.0f);
  const __m256 underflow = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_max_ps(x, low);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

// silu(g) * u for 8 lanes: g * sigmoid(g) with e = e^-|g| (never overflows):
// sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below.
GS_AVX2_FMA inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
  const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), magnitude));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 inverse = _mm256_div_ps(one, _mm256_add_ps(one, e));
  const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 sigmoid = _mm256_blendv_ps(inverse, _mm256_mul_ps(e, inverse), negative);
  return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u);
}

// gelu_tanh(g) * u for 8 lanes (Gemma's GeGLU): 0.5 g (1 + tanh(y)), y = sqrt(2/pi) (g + 0.044715 g^3),
// computed as g * sigmoid(2y) (the same function, without 1 + tanh's cancellation for g < 0),
// the sigmoid as in silu_mul8.
GS_AVX2_FMA inline __m256 gelu_tanh_mul8(__m256 g, __m256 u) {
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 y2 = _mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f),  // 2 sqrt(2/pi)
                                  _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), y2);
  const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), magnitude));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 inverse = _mm256_div_ps(one, _mm256_add_ps(one, e));
  const __m256 negative = _mm256_cmp_ps(y2, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 sigmoid = _mm256_blendv_ps(inverse, _mm256_mul_ps(e, inverse), negative);
  return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u);
}

}  // namespace goodspeed
