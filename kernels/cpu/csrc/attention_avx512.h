// The AVX-512 path of paged attention (decode_core.h): one task per (query token, KV head)
// attends with up to 8 query heads of that KV head (HeadGroup, attention_avx2.h), so each key
// and value row is read once per token instead of once per query head (GQA: G = 3 for SmolLM2,
// 7 for Qwen2.5-0.5B).
//
// Every quantity of a (query head, key) pair is computed the same way whatever else is in the
// step, as in attention_avx2.h:
//  * scores: 16 lanes per vector, one FMA chain over D per (head, key), the 16 lanes summed in one
//    fixed pattern (sum4x16), so a key's score does not depend on its slot or on the batch;
//  * softmax: softmax_avx2, per head (the denominator by rank among the seen keys);
//  * values: keys in position order, the keys the token does not see skipped, accumulated in
//    registers per 16 dimensions.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention_avx2.h"

#define GS_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c")))

namespace goodspeed {

inline bool avx512_attention() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

// The lane sums of a0 .. a3, in one fixed order: halves added, then the AVX2 hadd pattern.
GS_AVX512 inline __m128 sum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
  const __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
  const __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
  const __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// Sixteen cache elements widened to float32 (exact).
GS_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
GS_AVX512 inline __m512 load16(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
GS_AVX512 inline __m512 load16(const BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// scores[h * stride + p] = q_h . k_p * scale for the keys the token sees, -inf for the others.
template <int G, typename E>
GS_AVX512 inline void group_scores(const PagedT<E>& c, const QueryTask& task, const HeadGroup& heads,
                                   int64_t g, float scale, int64_t n, float* scores,
                                   int64_t stride) {
  const int64_t V = c.D / 16;
  for (int64_t p0 = 0; p0 < n; p0 += 4) {
    // The same prefetches as attention_scores (AVX2). Kept inline: a shared helper measured ~2x
    // slower here (docs/benchmarks.md §5f).
    for (int64_t p = p0 + kPrefetchKeys; p < std::min(n, p0 + kPrefetchKeys + 4); ++p) {
      prefetch_row(c.key(task.table, task.first + p, g), c.D);
    }
    for (int64_t p = p0; p < std::min(n, p0 + 4); ++p) {
      prefetch_row(c.key(task.table, task.first + p, g) + c.v_shift(), c.D);
    }
    const E* k[4];
    bool seen[4];
    for (int j = 0; j < 4; ++j) {
      k[j] = c.key(task.table, task.first + std::min(p0 + j, n - 1), g);
      seen[j] = task.sees(p0 + j);
    }
    for (int h = 0; h < G; ++h) {
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
      for (int64_t v = 0; v < V; ++v) {
        const __m512 qv = _mm512_loadu_ps(heads.q[h] + 16 * v);
        for (int j = 0; j < 4; ++j) {
          acc[j] = _mm512_fmadd_ps(qv, load16(k[j] + 16 * v), acc[j]);
        }
      }
      alignas(16) float sums[4];
      _mm_store_ps(sums, sum4x16(acc[0], acc[1], acc[2], acc[3]));
      for (int j = 0; j < 4 && p0 + j < n; ++j) {
        scores[h * stride + p0 + j] =
            seen[j] ? sums[j] * scale : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

// Accumulators per head in one pass over the values: G x VC of them, G broadcast weights and
// one value vector fit the 32 registers.
template <int G>
constexpr int kValueVectors = std::min(8, (31 - G) / G);

// out_h[d0 .. d0 + 16 nv) = inv_h * sum over seen p of w_h[p] * v_p[...], keys in order.
template <int G, typename E>
GS_AVX512 inline void group_values(const PagedT<E>& c, const QueryTask& task, const HeadGroup& heads,
                                   int64_t g, const float* w, int64_t stride, int64_t n,
                                   int64_t d0, int nv, const float* inv) {
  constexpr int VC = kValueVectors<G>;
  __m512 acc[G][VC];
  for (int h = 0; h < G; ++h) {
    for (int i = 0; i < VC; ++i) acc[h][i] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < n; ++p) {
    if (!task.sees(p)) continue;  // weight 0 for every head of this token
    const E* v = c.key(task.table, task.first + p, g) + c.v_shift() + d0;
    __m512 wp[G];
    for (int h = 0; h < G; ++h) wp[h] = _mm512_set1_ps(w[h * stride + p]);
    for (int i = 0; i < VC; ++i) {
      if (i >= nv) break;
      const __m512 vv = load16(v + 16 * i);
      for (int h = 0; h < G; ++h) acc[h][i] = _mm512_fmadd_ps(wp[h], vv, acc[h][i]);
    }
  }
  for (int h = 0; h < G; ++h) {
    const __m512 scale = _mm512_set1_ps(inv[h]);
    for (int i = 0; i < nv; ++i) {
      _mm512_storeu_ps(heads.out[h] + d0 + 16 * i, _mm512_mul_ps(acc[h][i], scale));
    }
  }
}

// One token's attention for the G query heads of KV head g. scores: room for G (2 n + 16).
template <int G, typename E>
GS_AVX512 inline void attend_group(const PagedT<E>& c, const QueryTask& task, const HeadGroup& heads,
                                   int64_t g, float scale, float* scores) {
  const int64_t n = task.num_keys(), stride = n + 8;
  for (int64_t p = 0; p < std::min(n, kPrefetchKeys); ++p) prefetch_row(c.key(task.table, task.first + p, g), c.D);
  group_scores<G>(c, task, heads, g, scale, n, scores, stride);
  float* seen = scores + G * stride;
  float inv[G];
  for (int h = 0; h < G; ++h) inv[h] = softmax_avx2(task, scores + h * stride, n, seen);
  constexpr int VC = kValueVectors<G>;
  for (int64_t d0 = 0; d0 < c.D; d0 += 16 * VC) {
    const int nv = (int)std::min<int64_t>(VC, (c.D - d0) / 16);
    group_values<G>(c, task, heads, g, scores, stride, n, d0, nv, inv);
  }
}

}  // namespace goodspeed
