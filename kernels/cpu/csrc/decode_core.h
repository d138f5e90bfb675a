// Raw-pointer cores of the decode-step ops (decode_ops.cpp wraps them for Python, stack.cpp
// runs them layer after layer without leaving C++). One implementation, so both give bitwise
// the same results.
//
// float32 throughout. Every output row depends on its own input row only, with one reduction
// order whatever the batch or thread count, so a row is bitwise the same alone or in a batch;
// a query's attention is a function of its query and the keys it sees, in position order, so a
// token verified inside a speculative chain gets the very result a plain decode step gives it.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kv_elements.h"
#include "vec_math.h"

namespace goodspeed {

// AVX2 paths also widen float16 KV with F16C, which every AVX2 CPU has.
inline bool avx2_fma() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

// A [rows, cols] float32 matrix with contiguous rows, `stride` floats apart.
struct Mat {
  float* data;
  int64_t stride;
  float* row(int64_t t) const { return data + t * stride; }
};

// ---- RMSNorm, with the residual add folded in ----
// One row: r += d (when given); o = w * (r * (1 / sqrt(mean(r^2) + eps))). o may be r.
inline void rms_norm_row(float* r, const float* d, const float* w, float eps, float* o,
                         int64_t C) {
  if (d) {
    for (int64_t c = 0; c < C; ++c) r[c] += d[c];
  }
  double squares = 0.0;
  for (int64_t c = 0; c < C; ++c) squares += (double)r[c] * (double)r[c];
  const float inv = 1.0f / std::sqrt((float)(squares / (double)C) + eps);
  for (int64_t c = 0; c < C; ++c) o[c] = w[c] * (r[c] * inv);
}

// residual += delta (when given); out = weight * (residual * (1 / sqrt(mean(residual^2) + eps))).
inline void rms_norm_rows(Mat residual, const Mat* delta, const float* w, float eps, Mat out,
                          int64_t T, int64_t C) {
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rms_norm_row(residual.row(t), delta ? delta->row(t) : nullptr, w, eps, out.row(t), C);
    }
  });
}

// QK-norm in place: heads first_head .. first_head + heads - 1 of every token of x [T, *, D]
// (rows `stride` apart), each normed over its D values by w [D] (the rows rms_norm_rows would
// norm, so the same values).
inline void norm_heads_rows(float* x, int64_t stride, int64_t T, int64_t first_head,
                            int64_t heads, int64_t D, const float* w, float eps) {
  at::parallel_for(0, T * heads, 16, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      float* row = x + (item / heads) * stride + (first_head + item % heads) * D;
      rms_norm_row(row, nullptr, w, eps, row, D);
    }
  });
}

// ---- RoPE (rotate-half), in place ----
// x [T, heads, D] (rows `stride` apart, heads `head_stride` apart):
// x = x * cos[pos] + roll(x, D / 2) * sin_signed[pos], tables [P, D]. D <= 1024, even.
inline void rope_rows(float* x, int64_t stride, int64_t head_stride, int64_t T, int64_t heads,
                      int64_t D, const int64_t* pos, const float* cos, const float* sin_signed) {
  const int64_t half = D / 2;
  at::parallel_for(0, T * heads, 64, [&](int64_t begin, int64_t end) {
    float tmp[1024];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads, h = item % heads;
      float* v = x + t * stride + h * head_stride;
      const float* c = cos + pos[t] * D;
      const float* s = sin_signed + pos[t] * D;
      for (int64_t i = 0; i < D; ++i) tmp[i] = v[i];
      for (int64_t i = 0; i < D; ++i) {
        const float a = tmp[i] * c[i], b = tmp[(i + half) % D] * s[i];
        v[i] = a + b;
      }
    }
  });
}

// ---- SwiGLU activation: out = silu(gate) * up, gate_up = [gate | up] ----
GS_AVX2_FMA inline void silu_mul_row_avx2(const float* g, const float* u, float* o, int64_t I) {
  for (int64_t i = 0; i < I; i += 8) {
    _mm256_storeu_ps(o + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
}

GS_AVX2_FMA inline void gelu_tanh_mul_row_avx2(const float* g, const float* u, float* o,
                                               int64_t I) {
  for (int64_t i = 0; i < I; i += 8) {
    _mm256_storeu_ps(o + i, gelu_tanh_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
}

inline float gelu_tanh_scalar(float g) {  // g * sigmoid(2y), as gelu_tanh_mul8
  return g / (1.0f + std::exp(-1.5957691216057308f * (g + 0.044715f * g * g * g)));
}

// out = act(gate) * up for gate_up = [gate | up]: act = silu (SwiGLU) or gelu_tanh (GeGLU).
// AVX2 (vectorised exp) when I % 8 == 0 and the CPU has it, else scalar: fixed per process.
inline void act_mul_rows(Mat gate_up, Mat out, int64_t T, int64_t I, bool gelu) {
  const bool avx2 = I % 8 == 0 && avx2_fma();
  at::parallel_for(0, T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = gate_up.row(t);
      const float* u = g + I;
      float* o = out.row(t);
      if (avx2) {
        if (gelu) {
          gelu_tanh_mul_row_avx2(g, u, o, I);
        } else {
          silu_mul_row_avx2(g, u, o, I);
        }
        continue;
      }
      for (int64_t i = 0; i < I; ++i) {
        o[i] = (gelu ? gelu_tanh_scalar(g[i]) : g[i] / (1.0f + std::exp(-g[i]))) * u[i];
      }
    }
  });
}

inline void silu_mul_rows(Mat gate_up, Mat out, int64_t T, int64_t I) {
  act_mul_rows(gate_up, out, T, I, false);
}

// ---- paged attention ----
// The cache of one layer, elements E (kv_elements.h): [blocks, 2, block_size, kv_heads, D].
template <typename E>
struct PagedT {
  E* cache;
  int64_t block_size, kv_heads, D;
  int shift;  // log2(block_size) when it is a power of two, else -1
  PagedT(E* cache_, int64_t block_size_, int64_t kv_heads_, int64_t D_)
      : cache(cache_), block_size(block_size_), kv_heads(kv_heads_), D(D_), shift(-1) {
    if ((block_size & (block_size - 1)) == 0) shift = __builtin_ctzll((unsigned long long)block_size);
  }
  E* k_of(int32_t block, int64_t offset, int64_t head) const {
    return cache + ((block * 2 * block_size + offset) * kv_heads + head) * D;
  }
  int64_t v_shift() const { return block_size * kv_heads * D; }  // V sits block_size rows on
  // Key p of a request (its block table), KV head g.
  const E* key(const int32_t* table, int64_t p, int64_t g) const {
    if (shift >= 0) return k_of(table[p >> shift], p & (block_size - 1), g);
    return k_of(table[p / block_size], p % block_size, g);
  }
};

// One query token and one query head (of KV head g): attends over the keys the token sees.
// Keys before `first` lie outside a sliding window and are never read: the kernels index keys
// relative to it (i = p - first), so a token's sums run over the same keys in the same order
// whichever step computes it.
struct QueryTask {
  const float* q;  // [D]
  float* out;      // [D]
  const int32_t* table;  // the request's block table
  int64_t hist, local, q_len;  // keys first..hist-1 always; new key j if visible(j)
  const uint8_t* mask;  // [q_len] row of a tree mask, or nullptr: causal (j <= local)
  int64_t first = 0;    // first key inside the window (0: no window)

  bool visible(int64_t p) const {
    if (p < first) return false;
    if (p < hist) return true;
    return mask ? mask[p - hist] != 0 : p - hist <= local;
  }
  // Keys i = 0 .. num_keys() - 1: a causal row stops at itself (a prefill chunk's later tokens
  // are never read), a tree row runs to the step's last token. Keys past a causal row's own
  // would only add exact zeros to its sums, so the cut changes no bit.
  int64_t num_keys() const { return (mask ? hist + q_len : hist + local + 1) - first; }
  bool sees(int64_t i) const { return visible(first + i); }
  int64_t seen_history() const { return std::max<int64_t>(0, hist - first); }
};

// The query's position: history + index for causal rows, history + depth for a tree node.
inline int64_t query_position(const QueryTask& task) {
  if (task.mask == nullptr) return task.hist + task.local;
  int64_t ancestors = 0;
  for (int64_t j = 0; j < task.q_len; ++j) ancestors += task.mask[j] != 0;
  return task.hist + ancestors - 1;
}

// Sets the first key a query sees under a sliding window of `window` keys (itself included;
// transformers' kv > q - window); window 0 is full attention.
inline void apply_window(QueryTask& task, int64_t window) {
  if (window > 0) task.first = std::max<int64_t>(0, query_position(task) - window + 1);
}

// Scores (already scaled; -inf for keys not seen) -> softmax weights in place; returns 1 / sum.
inline float softmax_(float* s, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < n; ++p) top = std::max(top, s[p]);
  float total = 0.0f;
  for (int64_t p = 0; p < n; ++p) {
    s[p] = std::exp(s[p] - top);  // exp(-inf) = 0 for keys the query does not see
    total += s[p];
  }
  return 1.0f / total;
}

// The portable path (no AVX2, or D % 8 != 0): plain loops in position order.
template <typename E>
inline void attend_scalar(const PagedT<E>& c, const QueryTask& task, int64_t g, float scale,
                          float* scores) {
  const int64_t n = task.num_keys(), D = c.D;
  for (int64_t i = 0; i < n; ++i) {
    scores[i] = -std::numeric_limits<float>::infinity();
    if (!task.sees(i)) continue;
    const E* k = c.key(task.table, task.first + i, g);
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc += task.q[d] * to_float(k[d]);
    scores[i] = acc * scale;
  }
  const float inv = softmax_(scores, n);
  for (int64_t d = 0; d < D; ++d) task.out[d] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (scores[i] == 0.0f) continue;
    const E* v = c.key(task.table, task.first + i, g) + c.v_shift();
    for (int64_t d = 0; d < D; ++d) task.out[d] += scores[i] * to_float(v[d]);
  }
  for (int64_t d = 0; d < D; ++d) task.out[d] *= inv;
}

}  // namespace goodspeed

#include "attention_avx2.h"
#include "attention_avx512.h"

namespace goodspeed {

// The widest attention path a process may take: 2 = AVX-512, 1 = AVX2 (both per KV head),
// 0 = scalar (per query head). Lowered by tests to cover every path on one machine; a process that
// serves uses one path throughout (decode and verification must agree bit for bit).
inline std::atomic<int> attention_isa_cap{2};

// (query, key) pairs times query heads below which attention runs on the calling thread.
constexpr int64_t kParallelPairs = 4096;

// The step's tokens in the order their tasks are handed out: first, last, second, second to
// last, ... A prefill chunk's token i sees i keys more than its first, so each thread's
// contiguous share of the tasks gets about the same number of keys.
inline int64_t balanced_token(int64_t i, int64_t T) { return i % 2 == 0 ? i / 2 : T - 1 - i / 2; }

// One step's attention batch: where its tokens' k/v go and which keys each query sees.
struct AttentionBatch {
  const int64_t* slots;   // [T]
  const int32_t* tables;  // [R, max_blocks]
  int64_t max_blocks;
  const int32_t* tokens;  // [T, 4]: request, history length, index among new, number of new
  const uint8_t* mask;    // [T, mask_stride] tree-mask rows, or nullptr
  int64_t mask_stride, T;
};

// Rows of a [T, heads, D] view: rows `stride` apart, heads `head` apart, D contiguous.
struct Heads {
  const float* data;
  int64_t stride, head;
  const float* at(int64_t t, int64_t h) const { return data + t * stride + h * head; }
};

// Token t, query head h of a step's batch.
inline QueryTask query_task(Heads q, const AttentionBatch& b, int64_t t, int64_t h, int64_t H,
                            int64_t D, float* out, int64_t window) {
  const int32_t* row = b.tokens + 4 * t;
  QueryTask task{q.at(t, h),
                 out + (t * H + h) * D,
                 b.tables + row[0] * b.max_blocks,
                 row[1],
                 row[2],
                 row[3],
                 b.mask ? b.mask + t * b.mask_stride : nullptr};
  apply_window(task, window);
  return task;
}

// q [T, H, D] and k, v [T, Hkv, D]; out [T, H, D] contiguous. Writes k/v into the cache, then
// attends each (token, KV head) pair; window > 0: over the last `window` positions only.
template <typename E>
inline void paged_attention(const PagedT<E>& c, Heads q, Heads k, Heads v, int64_t H,
                            const AttentionBatch& b, float scale, float* out, int64_t window) {
  const int64_t D = c.D, Hkv = c.kv_heads;
  for (int64_t t = 0; t < b.T; ++t) {
    const int64_t block = b.slots[t] / c.block_size, offset = b.slots[t] % c.block_size;
    E* k_dst = c.k_of((int32_t)block, offset, 0);
    for (int64_t h = 0; h < Hkv; ++h) {
      const float* ks = k.at(t, h);
      const float* vs = v.at(t, h);
      for (int64_t d = 0; d < D; ++d) store_kv(k_dst + h * D + d, ks[d]);
      for (int64_t d = 0; d < D; ++d) store_kv(k_dst + c.v_shift() + h * D + d, vs[d]);
    }
  }
  const int64_t group = H / Hkv;
  // Threads pay off past a few thousand (query, key) pairs; below that the fork costs more.
  int64_t pairs = 0;
  for (int64_t t = 0; t < b.T; ++t) pairs += b.tokens[4 * t + 1] + b.tokens[4 * t + 3];
  const bool threaded = pairs * H >= kParallelPairs;
  const int cap = attention_isa_cap.load();
  const bool avx512 = cap >= 2 && D % 16 == 0 && group <= kMaxGroupHeads && avx512_attention();
  const bool avx2 = !avx512 && cap >= 1 && D % 8 == 0 && avx2_fma();
  if (!avx512 && !avx2) {
    at::parallel_for(0, b.T * H, threaded ? 1 : b.T * H, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = balanced_token(item / H, b.T), h = item % H;
        const QueryTask task = query_task(q, b, t, h, H, D, out, window);
        scores.resize(task.num_keys());
        attend_scalar(c, task, h / group, scale, scores.data());
      }
    });
    return;
  }
  // One task per (token, KV head, part of its query heads): the heads of a KV head in parts of
  // at most kMaxGroupHeads, in more parts when there are fewer tasks than threads. A head's
  // result does not depend on which heads share its task.
  const int64_t threads = threaded ? at::get_num_threads() : 1;
  const int64_t parts = std::min(
      group, std::max((group + kMaxGroupHeads - 1) / kMaxGroupHeads,
                      (threads + b.T * Hkv - 1) / (b.T * Hkv)));
  const int64_t per_part = (group + parts - 1) / parts;
  const int64_t items = b.T * Hkv * parts;
  at::parallel_for(0, items, threaded ? 1 : items, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      // KV head first: a thread's run of tasks reads one head's keys and values over and over.
      const int64_t g = item / (b.T * parts), t = balanced_token(item / parts % b.T, b.T);
      const int64_t h0 = g * group + item % parts * per_part;
      const int64_t G = std::min(per_part, (g + 1) * group - h0);
      const QueryTask task = query_task(q, b, t, h0, H, D, out, window);
      HeadGroup heads;
      for (int64_t i = 0; i < G; ++i) {
        heads.q[i] = q.at(t, h0 + i);
        heads.out[i] = out + (t * H + h0 + i) * D;
      }
      scores.resize(G * (2 * task.num_keys() + 16) + 8);
      with_group_size(G, [&](auto size) {
        constexpr int kG = decltype(size)::value;
        if (avx512) {
          attend_group<kG>(c, task, heads, g, scale, scores.data());
        } else {
          attend_group_avx2<kG>(c, task, heads, g, scale, scores.data());
        }
      });
    }
  });
}

}  // namespace goodspeed
