// The AVX2 path of one query head's paged attention (decode_core.h), for D % 8 == 0.
//
// Every quantity of a (query, key) pair is computed the same way whatever else is in the step:
//  * scores: four keys at a time (four independent FMA chains over D), each key's eight lanes
//    summed in one fixed order (hadd pattern), so a key's score does not depend on its slot;
//  * softmax: a max (order-free), then e^(s - max) in vectors of 8 keys, exactly 0 for keys the
//    query does not see; the denominator sums the seen keys by rank among the seen keys (lane =
//    rank % 8), one fixed horizontal sum at the end, so a token verified in a chain or a tree
//    sums the very values, in the very order, that a decode step of that token sums;
//  * values: sum over keys in position order, zero weights skipped, accumulated in registers.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kv_elements.h"
#include "vec_math.h"

namespace goodspeed {

GS_AVX2_FMA inline float hsum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The cache lines of one head's row of D elements.
template <typename E>
inline void prefetch_row(const E* row, int64_t D) {
  const char* bytes = (const char*)row;
  for (int64_t b = 0; b < D * (int64_t)sizeof(E); b += 64) _mm_prefetch(bytes + b, _MM_HINT_T0);
}

// Eight cache elements widened to float32 (exact).
GS_AVX2_FMA inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
GS_AVX2_FMA inline __m256 load8(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
GS_AVX2_FMA inline __m256 load8(const BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Keys ahead of the scores' pass, and the values the weighted sum will read: the cache rows of
// a step's KV are mostly cold (the weights streamed through since the last step), and a
// request's blocks are scattered, so the hardware prefetchers lose the stream at each block.
constexpr int64_t kPrefetchKeys = 16;

// scores[p] = q . k_p * scale for the keys the query sees, -inf for the others (p < n).
template <typename E>
GS_AVX2_FMA inline void attention_scores(const PagedT<E>& c, const QueryTask& task, int64_t g,
                                         float scale, int64_t n, float* scores) {
  for (int64_t p0 = 0; p0 < n; p0 += 4) {
    for (int64_t p = p0 + kPrefetchKeys; p < std::min(n, p0 + kPrefetchKeys + 4); ++p) {
      prefetch_row(c.key(task.table, task.first + p, g), c.D);
    }
    for (int64_t p = p0; p < std::min(n, p0 + 4); ++p) {
      prefetch_row(c.key(task.table, task.first + p, g) + c.v_shift(), c.D);
    }
    const E* k[4];
    for (int j = 0; j < 4; ++j) k[j] = c.key(task.table, task.first + std::min(p0 + j, n - 1), g);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t d = 0; d < c.D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(task.q + d);
      for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(qv, load8(k[j] + d), acc[j]);
    }
    // Key j's sum is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) in every slot j.
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    alignas(16) float sums[4];
    _mm_store_ps(sums, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
    for (int j = 0; j < 4 && p0 + j < n; ++j) {
      scores[p0 + j] = task.sees(p0 + j) ? sums[j] * scale
                                            : -std::numeric_limits<float>::infinity();
    }
  }
}

// Scores -> e^(s - max) in place (padded to a multiple of 8 with zeros); returns 1 / sum.
// The sum runs over the seen keys in their order among the seen keys, lane = rank % 8: a tree
// node sees the history and its ancestors with unseen siblings between them, while the same
// token decoded after acceptance sees them at consecutive positions; ranks make both sums one.
// `seen`: room for n + 8 floats.
GS_AVX2_FMA inline float softmax_avx2(const QueryTask& task, float* s, int64_t n, float* seen) {
  const int64_t padded = (n + 7) / 8 * 8;
  for (int64_t p = n; p < padded; ++p) s[p] = -std::numeric_limits<float>::infinity();
  __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t p = 0; p < padded; p += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + p));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  const __m256 max = _mm256_set1_ps(_mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m))));
  for (int64_t p = 0; p < padded; p += 8) {
    _mm256_storeu_ps(s + p, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + p), max)));
  }
  const float* ranked = s;  // causal rows: the seen keys are a prefix, zeros after it
  int64_t count = n;
  if (task.mask != nullptr) {
    count = task.seen_history();
    std::copy(s, s + count, seen);
    for (int64_t p = count; p < n; ++p) {
      if (task.sees(p)) seen[count++] = s[p];
    }
    ranked = seen;
  }
  __m256 total = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= count; p += 8) total = _mm256_add_ps(total, _mm256_loadu_ps(ranked + p));
  alignas(32) float tail[8] = {};
  for (int64_t i = 0; p + i < count; ++i) tail[i] = ranked[p + i];
  total = _mm256_add_ps(total, _mm256_load_ps(tail));
  return 1.0f / hsum8(total);
}

// out[0 .. 8V) = inv * sum over p of w_p * v_p[d0 .. d0 + 8V), keys in position order.
template <int V, typename E>
GS_AVX2_FMA inline void weighted_values(const PagedT<E>& c, const QueryTask& task, int64_t g,
                                        const float* w, int64_t n, int64_t d0, float inv) {
  __m256 acc[V];
  for (int i = 0; i < V; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t p = 0; p < n; ++p) {
    if (w[p] == 0.0f) continue;
    const E* v = c.key(task.table, task.first + p, g) + c.v_shift() + d0;
    const __m256 wp = _mm256_set1_ps(w[p]);
    for (int i = 0; i < V; ++i) acc[i] = _mm256_fmadd_ps(wp, load8(v + 8 * i), acc[i]);
  }
  const __m256 scale = _mm256_set1_ps(inv);
  for (int i = 0; i < V; ++i) _mm256_storeu_ps(task.out + d0 + 8 * i, _mm256_mul_ps(acc[i], scale));
}

// scores: room for 2 (n + 8) floats.
template <typename E>
GS_AVX2_FMA inline void attend_avx2(const PagedT<E>& c, const QueryTask& task, int64_t g, float scale,
                                    float* scores) {
  const int64_t n = task.num_keys();
  for (int64_t p = 0; p < std::min(n, kPrefetchKeys); ++p) prefetch_row(c.key(task.table, task.first + p, g), c.D);
  attention_scores(c, task, g, scale, n, scores);
  const float inv = softmax_avx2(task, scores, n, scores + n + 8);
  for (int64_t d0 = 0; d0 < c.D; d0 += 64) {  // eight vectors of accumulators at a time
    switch (std::min<int64_t>(8, (c.D - d0) / 8)) {
      case 8: weighted_values<8>(c, task, g, scores, n, d0, inv); break;
      case 7: weighted_values<7>(c, task, g, scores, n, d0, inv); break;
      case 6: weighted_values<6>(c, task, g, scores, n, d0, inv); break;
      case 5: weighted_values<5>(c, task, g, scores, n, d0, inv); break;
      case 4: weighted_values<4>(c, task, g, scores, n, d0, inv); break;
      case 3: weighted_values<3>(c, task, g, scores, n, d0, inv); break;
      case 2: weighted_values<2>(c, task, g, scores, n, d0, inv); break;
      case 1: weighted_values<1>(c, task, g, scores, n, d0, inv); break;
    }
  }
}

}  // namespace goodspeed
