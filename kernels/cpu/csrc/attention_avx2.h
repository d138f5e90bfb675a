// The AVX2 path of paged attention (decode_core.h), for D % 8 == 0: one task per (query token,
// KV head, up to 8 of its query heads) reads each key and value row once for those heads.
//
// Every quantity of a (query head, key) pair is computed the same way whatever else is in the step:
//  * scores: two heads and four keys at a time (eight independent FMA chains over D, each in d
//    order), each key's eight lanes summed in one fixed order (hadd pattern), so a key's score
//    does not depend on its slot or on the heads beside it;
//  * softmax: a max (order-free), then e^(s - max) in vectors of 8 keys, exactly 0 for keys the
//    query does not see; the denominator sums the seen keys by rank among the seen keys (lane =
//    rank % 8), one fixed horizontal sum at the end, so a token verified in a chain or a tree
//    sums the very values, in the very order, that a decode step of that token sums;
//  * values: sum over the seen keys in position order, accumulated in registers (a weight that
//    underflowed to 0 adds an exact +0).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

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

// Query heads per KV head one task takes (the AVX-512 path's accumulators must fit 32
// registers); a larger group is split into several tasks.
constexpr int64_t kMaxGroupHeads = 8;

// f(std::integral_constant<int, G>{}) for the group size G = 1 .. kMaxGroupHeads: the vector
// paths' kernels take G as a template argument.
template <typename F>
inline void with_group_size(int64_t G, F&& f) {
  switch (G) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
  }
}

// The query heads of one task, all of one KV head: head i's query q[i] and output out[i], [D].
struct HeadGroup {
  const float* q[kMaxGroupHeads];
  float* out[kMaxGroupHeads];
};

// The lane sums of q_h . k_j for NH heads and four keys: NH x 4 independent FMA chains over D,
// each (head, key) chain in d order whatever NH is; each key's vector is loaded once for the NH
// heads. Key j's sum is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) in every slot j.
template <int NH, typename E>
GS_AVX2_FMA inline void quad_scores(const E* const* k, const float* const* q, int64_t D,
                                    __m128* sums) {
  // Every loop over heads, keys and vectors is unrolled, so the sums live in registers.
  __m256 acc[NH][4];
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[h][j] = _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t d = 0; d < D; d += 8) {
    __m256 kv[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) kv[j] = load8(k[j] + d);
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const __m256 qv = _mm256_loadu_ps(q[h] + d);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[h][j] = _mm256_fmadd_ps(qv, kv[j], acc[h][j]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(acc[h][0], acc[h][1]),
                                    _mm256_hadd_ps(acc[h][2], acc[h][3]));
    sums[h] = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  }
}

// scores[h * stride + p] = q_h . k_p * scale for the keys the token sees, -inf for the others
// (p < n), heads two at a time; each key's rows are read from memory once for the G heads.
template <int G, typename E>
GS_AVX2_FMA inline void group_scores_avx2(const PagedT<E>& c, const QueryTask& task,
                                          const HeadGroup& heads, int64_t g, float scale,
                                          int64_t n, float* scores, int64_t stride) {
  for (int64_t p0 = 0; p0 < n; p0 += 4) {
    for (int64_t p = p0 + kPrefetchKeys; p < std::min(n, p0 + kPrefetchKeys + 4); ++p) {
      prefetch_row(c.key(task.table, task.first + p, g), c.D);
    }
    const E* k[4];
    bool seen[4];
    for (int j = 0; j < 4; ++j) {
      k[j] = c.key(task.table, task.first + std::min(p0 + j, n - 1), g);
      seen[j] = task.sees(p0 + j);
    }
    __m128 sums[G];
    for (int h = 0; h + 1 < G; h += 2) quad_scores<2>(k, heads.q + h, c.D, sums + h);
    if constexpr (G % 2 == 1) quad_scores<1>(k, heads.q + G - 1, c.D, sums + G - 1);
    for (int h = 0; h < G; ++h) {
      alignas(16) float lanes[4];
      _mm_store_ps(lanes, sums[h]);
      for (int j = 0; j < 4 && p0 + j < n; ++j) {
        scores[h * stride + p0 + j] =
            seen[j] ? lanes[j] * scale : -std::numeric_limits<float>::infinity();
      }
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

// Value vectors per pass over the keys: G x VC accumulators, VC values and one broadcast
// weight fit the 16 registers.
template <int G>
constexpr int kValueVectorsAvx2 = 15 / (G + 1);

// out_h[d0 .. d0 + 8 NV) = inv_h * sum over seen p of w_h[p] * v_p[...], keys in position
// order; rows[p] is key p's value row, nullptr where the token does not see it. A seen key
// whose weight underflowed to 0 adds an exact +0 to a sum that is never -0. NV is a constant
// so that the G x NV sums can stay in registers.
template <int G, int NV, typename E>
GS_AVX2_FMA inline void group_values_avx2(const E* const* rows, const HeadGroup& heads,
                                          const float* w, int64_t stride, int64_t n, int64_t d0,
                                          const float* inv) {
  // Every loop over heads and vectors is unrolled, so the sums live in registers.
  __m256 acc[G][NV];
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) {
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) acc[h][i] = _mm256_setzero_ps();
  }
  constexpr int64_t ahead = 8;
  for (int64_t p = 0; p < n; ++p) {
    if (p + ahead < n && rows[p + ahead] != nullptr) {
      _mm_prefetch((const char*)(rows[p + ahead] + d0), _MM_HINT_T0);
    }
    const E* v = rows[p];
    if (v == nullptr) continue;  // weight 0 for every head of this token
    __m256 vv[NV];
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) vv[i] = load8(v + d0 + 8 * i);
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const __m256 wp = _mm256_broadcast_ss(w + h * stride + p);
#pragma GCC unroll 8
      for (int i = 0; i < NV; ++i) acc[h][i] = _mm256_fmadd_ps(wp, vv[i], acc[h][i]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h) {
    const __m256 scale = _mm256_set1_ps(inv[h]);
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) {
      _mm256_storeu_ps(heads.out[h] + d0 + 8 * i, _mm256_mul_ps(acc[h][i], scale));
    }
  }
}

// The last nv < VC value vectors of a row.
template <int G, int VC, typename E>
GS_AVX2_FMA inline void group_values_tail_avx2(int nv, const E* const* rows,
                                               const HeadGroup& heads, const float* w,
                                               int64_t stride, int64_t n, int64_t d0,
                                               const float* inv) {
  if constexpr (VC > 1) {
    if (nv == VC - 1) {
      group_values_avx2<G, VC - 1>(rows, heads, w, stride, n, d0, inv);
    } else {
      group_values_tail_avx2<G, VC - 1>(nv, rows, heads, w, stride, n, d0, inv);
    }
  }
}

// One token's attention for the G query heads of KV head g (of one task). scores: room for
// G (2 n + 16) floats.
template <int G, typename E>
GS_AVX2_FMA inline void attend_group_avx2(const PagedT<E>& c, const QueryTask& task,
                                          const HeadGroup& heads, int64_t g, float scale,
                                          float* scores) {
  const int64_t n = task.num_keys(), stride = n + 8;
  for (int64_t p = 0; p < std::min(n, kPrefetchKeys); ++p) {
    prefetch_row(c.key(task.table, task.first + p, g), c.D);
  }
  group_scores_avx2<G>(c, task, heads, g, scale, n, scores, stride);
  float* seen = scores + G * stride;
  float inv[G];
  for (int h = 0; h < G; ++h) inv[h] = softmax_avx2(task, scores + h * stride, n, seen);
  thread_local std::vector<const E*> rows;
  rows.resize(n);
  for (int64_t p = 0; p < n; ++p) {
    rows[p] = task.sees(p) ? c.key(task.table, task.first + p, g) + c.v_shift() : nullptr;
  }
  constexpr int VC = kValueVectorsAvx2<G>;
  int64_t d0 = 0;
  for (; d0 + 8 * VC <= c.D; d0 += 8 * VC) {
    group_values_avx2<G, VC>(rows.data(), heads, scores, stride, n, d0, inv);
  }
  if (d0 < c.D) {
    const int nv = (int)((c.D - d0) / 8);
    group_values_tail_avx2<G, VC>(nv, rows.data(), heads, scores, stride, n, d0, inv);
  }
}

}  // namespace goodspeed
