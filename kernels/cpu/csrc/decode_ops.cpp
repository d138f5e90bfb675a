// The small ops of a decoder layer, fused for the CPU decode step, and paged attention that reads
// the shared KV cache layout (kernels/attention.py) in place instead of gathering it.
//
// float32 throughout. Every output row depends on its own input row only, with one reduction
// order whatever the batch or thread count, so a row is bitwise the same alone or in a batch;
// a query's attention is a function of its query and the keys it sees, in position order, so a
// token verified inside a speculative chain gets the very result a plain decode step gives it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <immintrin.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#define GS_AVX2_FMA __attribute__((target("avx2,fma")))

namespace goodspeed {
namespace {

bool avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

void check_float(const at::Tensor& t, int64_t dims, const char* name) {
  TORCH_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.dim() == dims && t.stride(-1) == 1,
              name, " must be a CPU float32 tensor of ", dims, " dims with a contiguous last dim");
}

// ---- RMSNorm, with the residual add folded in ----
// residual += delta (when given); out = weight * (residual * (1 / sqrt(mean(residual^2) + eps))).
void rms_norm_out(at::Tensor& residual, const std::optional<at::Tensor>& delta,
                  const at::Tensor& weight, double eps, at::Tensor& out) {
  check_float(residual, 2, "residual");
  check_float(out, 2, "out");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == at::kFloat, "weight: float32");
  const int64_t T = residual.size(0), C = residual.size(1);
  TORCH_CHECK(weight.numel() == C && out.size(0) == T && out.size(1) == C, "shape mismatch");
  if (delta) {
    check_float(*delta, 2, "delta");
    TORCH_CHECK(delta->size(0) == T && delta->size(1) == C, "delta must match residual");
  }
  const float* w = weight.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* r = residual.data_ptr<float>() + t * residual.stride(0);
      if (delta) {
        const float* d = delta->data_ptr<float>() + t * delta->stride(0);
        for (int64_t c = 0; c < C; ++c) r[c] += d[c];
      }
      double squares = 0.0;
      for (int64_t c = 0; c < C; ++c) squares += (double)r[c] * (double)r[c];
      const float inv = 1.0f / std::sqrt((float)(squares / (double)C) + (float)eps);
      float* o = out.data_ptr<float>() + t * out.stride(0);
      for (int64_t c = 0; c < C; ++c) o[c] = w[c] * (r[c] * inv);
    }
  });
}

// ---- RoPE (rotate-half), in place ----
// x [T, heads, D]: x = x * cos[pos] + roll(x, D / 2) * sin_signed[pos], tables [P, D].
void rope_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos,
           const at::Tensor& sin_signed) {
  check_float(x, 3, "x");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "positions");
  TORCH_CHECK(cos.is_contiguous() && sin_signed.is_contiguous() && cos.dim() == 2, "tables");
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2), half = D / 2;
  TORCH_CHECK(cos.size(1) == D && D % 2 == 0 && D <= 1024, "head_dim must be even, <= 1024");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " out of range");
  }
  at::parallel_for(0, T * heads, 64, [&](int64_t begin, int64_t end) {
    float tmp[1024];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads, h = item % heads;
      float* v = x.data_ptr<float>() + t * x.stride(0) + h * x.stride(1);
      const float* c = cos.data_ptr<float>() + pos[t] * D;
      const float* s = sin_signed.data_ptr<float>() + pos[t] * D;
      for (int64_t i = 0; i < D; ++i) tmp[i] = v[i];
      for (int64_t i = 0; i < D; ++i) {
        const float a = tmp[i] * c[i], b = tmp[(i + half) % D] * s[i];
        v[i] = a + b;
      }
    }
  });
}

// ---- SwiGLU activation: out = silu(gate) * up, gate_up = [gate | up] ----
void silu_mul_out(const at::Tensor& gate_up, at::Tensor& out) {
  check_float(gate_up, 2, "gate_up");
  check_float(out, 2, "out");
  const int64_t T = gate_up.size(0), I = out.size(1);
  TORCH_CHECK(gate_up.size(1) == 2 * I && out.size(0) == T, "gate_up must be [T, 2 * out cols]");
  at::parallel_for(0, T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = gate_up.data_ptr<float>() + t * gate_up.stride(0);
      const float* u = g + I;
      float* o = out.data_ptr<float>() + t * out.stride(0);
      for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

// ---- paged attention ----
struct Paged {
  float* cache;  // [blocks, 2, block_size, kv_heads, D]
  int64_t block_size, kv_heads, D;
  float* k_of(int32_t block, int64_t offset, int64_t head) const {
    return cache + ((block * 2 * block_size + offset) * kv_heads + head) * D;
  }
  int64_t v_shift() const { return block_size * kv_heads * D; }  // V sits block_size rows on
};

// One query token t and one KV head g: the query heads of g's group attend over the keys t sees.
struct QueryTask {
  const float* q;  // query head g * group at q, then q_head_stride apart
  int64_t q_head_stride;
  float* out;  // [group, D] contiguous
  const int32_t* table;  // the request's block table
  int64_t hist, local, q_len;  // keys 0..hist-1 always; new key j if visible(j)
  const uint8_t* mask;  // [q_len] row of a tree mask, or nullptr: causal (j <= local)

  bool visible(int64_t p) const {
    if (p < hist) return true;
    return mask ? mask[p - hist] != 0 : p - hist <= local;
  }
};

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

// Dot products and AXPYs over one head of D floats: eight lanes and a fixed horizontal sum on
// AVX2 (D % 8 == 0), plain loops otherwise. Which one runs is fixed per process, and each
// query's keys are visited in position order, so a query's result never depends on the batch.
GS_AVX2_FMA void attend_avx2(const Paged& c, const QueryTask& task, int64_t g, int64_t group,
                             float scale, float* scores) {
  const int64_t n = task.hist + task.q_len, D = c.D, bs = c.block_size;
  for (int64_t i = 0; i < group * n; ++i) scores[i] = -std::numeric_limits<float>::infinity();
  for (int64_t p0 = 0; p0 < n; p0 += bs) {  // block by block: no division per key
    const float* k = c.k_of(task.table[p0 / bs], 0, g);
    for (int64_t p = p0; p < std::min(n, p0 + bs); ++p, k += c.kv_heads * D) {
      if (!task.visible(p)) continue;
      for (int64_t h = 0; h < group; ++h) {
        const float* q = task.q + h * task.q_head_stride;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
        }
        const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        scores[h * n + p] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1))) * scale;
      }
    }
  }
  float inverse[64];
  for (int64_t h = 0; h < group; ++h) inverse[h] = softmax_(scores + h * n, n);
  for (int64_t h = 0; h < group; ++h) {
    float* out = task.out + h * D;
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_setzero_ps());
  }
  for (int64_t p0 = 0; p0 < n; p0 += bs) {
    const float* v = c.k_of(task.table[p0 / bs], 0, g) + c.v_shift();
    for (int64_t p = p0; p < std::min(n, p0 + bs); ++p, v += c.kv_heads * D) {
      for (int64_t h = 0; h < group; ++h) {
        const float weight = scores[h * n + p];
        if (weight == 0.0f) continue;
        float* out = task.out + h * D;
        const __m256 w = _mm256_set1_ps(weight);
        for (int64_t d = 0; d < D; d += 8) {
          _mm256_storeu_ps(out + d,
                           _mm256_fmadd_ps(w, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
        }
      }
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    float* out = task.out + h * D;
    const __m256 inv = _mm256_set1_ps(inverse[h]);
    for (int64_t d = 0; d < D; d += 8) {
      _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), inv));
    }
  }
}

void attend_scalar(const Paged& c, const QueryTask& task, int64_t g, int64_t group, float scale,
                   float* scores) {
  const int64_t n = task.hist + task.q_len, D = c.D;
  for (int64_t i = 0; i < group * n; ++i) scores[i] = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < n; ++p) {
    if (!task.visible(p)) continue;
    const float* k = c.k_of(task.table[p / c.block_size], p % c.block_size, g);
    for (int64_t h = 0; h < group; ++h) {
      const float* q = task.q + h * task.q_head_stride;
      float acc = 0.0f;
      for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
      scores[h * n + p] = acc * scale;
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    float* s = scores + h * n;
    const float inv = softmax_(s, n);
    float* out = task.out + h * D;
    for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
    for (int64_t p = 0; p < n; ++p) {
      if (s[p] == 0.0f) continue;
      const float* v = c.k_of(task.table[p / c.block_size], p % c.block_size, g) + c.v_shift();
      for (int64_t d = 0; d < D; ++d) out[d] += s[p] * v[d];
    }
    for (int64_t d = 0; d < D; ++d) out[d] *= inv;
  }
}

void write_kv(const Paged& c, const at::Tensor& k, const at::Tensor& v, const int64_t* slots) {
  for (int64_t t = 0; t < k.size(0); ++t) {
    const int64_t block = slots[t] / c.block_size, offset = slots[t] % c.block_size;
    float* k_dst = c.k_of((int32_t)block, offset, 0);
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      const float* ks = k.data_ptr<float>() + t * k.stride(0) + h * k.stride(1);
      const float* vs = v.data_ptr<float>() + t * v.stride(0) + h * v.stride(1);
      std::copy(ks, ks + c.D, k_dst + h * c.D);
      std::copy(vs, vs + c.D, k_dst + c.v_shift() + h * c.D);
    }
  }
}

// q [T, H, D], k/v [T, Hkv, D] (last dims contiguous), cache [blocks, 2, bs, Hkv, D],
// slots [T] int64 (where this step's k/v go), block_tables [R, max_blocks] int32,
// tokens [T, 4] int32 = (request, history length before the step's tokens, index among the
// request's new tokens, request's number of new tokens), mask [T, max_q_len] uint8 or None.
void paged_attention_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         at::Tensor& cache, const at::Tensor& slots,
                         const at::Tensor& block_tables, const at::Tensor& tokens,
                         const std::optional<at::Tensor>& mask, double scale, at::Tensor& out) {
  check_float(q, 3, "q");
  check_float(k, 3, "k");
  check_float(v, 3, "v");
  TORCH_CHECK(cache.is_contiguous() && cache.dim() == 5 && cache.scalar_type() == at::kFloat,
              "cache must be a contiguous float32 [blocks, 2, block_size, kv_heads, D] tensor");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes(), "out must be contiguous like q");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous(), "slots: int64");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(), "tables");
  TORCH_CHECK(tokens.scalar_type() == at::kInt && tokens.is_contiguous() && tokens.dim() == 2 &&
                  tokens.size(1) == 4 && tokens.size(0) == q.size(0),
              "tokens must be int32 [T, 4]");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1);
  TORCH_CHECK(H % Hkv == 0 && H / Hkv <= 64 && cache.size(3) == Hkv && cache.size(4) == D,
              "head shapes (at most 64 query heads per KV head)");
  if (mask) {
    TORCH_CHECK(mask->scalar_type() == at::kByte && mask->is_contiguous() && mask->dim() == 2 &&
                    mask->size(0) == T,
                "mask must be uint8 [T, max_q_len]");
  }
  const Paged c{cache.data_ptr<float>(), cache.size(2), Hkv, D};
  write_kv(c, k, v, slots.data_ptr<int64_t>());
  const int32_t* info = tokens.data_ptr<int32_t>();
  const int64_t group = H / Hkv, max_blocks = block_tables.size(1);
  const bool avx2 = D % 8 == 0 && avx2_fma();
  // Threads only pay off past a few thousand (query, key) pairs: a batch-1 decode at a short
  // context runs inline (measured: 2 threads made one such call ~10x slower on this VM).
  int64_t pairs = 0;
  for (int64_t t = 0; t < T; ++t) pairs += info[4 * t + 1] + info[4 * t + 3];
  const int64_t grain = pairs * Hkv < 16384 ? T * Hkv : 1;
  at::parallel_for(0, T * Hkv, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / Hkv, g = item % Hkv;
      const int32_t* row = info + 4 * t;
      const QueryTask task{
          q.data_ptr<float>() + t * q.stride(0) + g * group * q.stride(1),
          q.stride(1),
          out.data_ptr<float>() + (t * H + g * group) * D,
          block_tables.data_ptr<int32_t>() + row[0] * max_blocks,
          row[1],
          row[2],
          row[3],
          mask ? mask->data_ptr<uint8_t>() + t * mask->size(1) : nullptr};
      scores.resize(group * (row[1] + row[3]));
      if (avx2) {
        attend_avx2(c, task, g, group, (float)scale, scores.data());
      } else {
        attend_scalar(c, task, g, group, (float)scale, scores.data());
      }
    }
  });
}

}  // namespace

void register_decode_ops(pybind11::module& m) {
  m.def("rms_norm_out", &rms_norm_out, "residual (+= delta); out = weight * rmsnorm(residual)",
        pybind11::arg("residual"), pybind11::arg("delta"), pybind11::arg("weight"),
        pybind11::arg("eps"), pybind11::arg("out"));
  m.def("rope_", &rope_, "rotate-half RoPE in place on x [T, heads, D]", pybind11::arg("x"),
        pybind11::arg("positions"), pybind11::arg("cos"), pybind11::arg("sin_signed"));
  m.def("silu_mul_out", &silu_mul_out, "out = silu(gate) * up", pybind11::arg("gate_up"),
        pybind11::arg("out"));
  m.def("paged_attention_out", &paged_attention_out,
        "write k/v into the paged cache, then attend each query over the keys it sees",
        pybind11::call_guard<pybind11::gil_scoped_release>(), pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("cache"),
        pybind11::arg("slots"), pybind11::arg("block_tables"), pybind11::arg("tokens"),
        pybind11::arg("mask"), pybind11::arg("scale"), pybind11::arg("out"));
}

}  // namespace goodspeed
