// Each row's k largest entries, largest first (kernels/sampling.py: topk_rows), for the target's
// top ids Token Recycling reads every step: torch.topk took ~0.2 ms a 152k-token row on the
// 2-core VM, ~2.5 ms of a twelve-request Qwen step (docs/benchmarks.md §5zs).
//
// One pass per row, keeping the k best seen so far in a sorted list: a block of entries (64 with
// AVX2, 16 otherwise) is first compared with the list's smallest at once, and only a block
// holding a larger entry is walked. Ties keep the lower index first (a later equal entry never
// displaces an earlier one), so a row's answer is the same whatever the threads. NaN compares
// false: it enters only among a row's first k entries, where it stays and may hide larger
// entries after it (the verifier fails a row with a NaN logit whatever its top ids).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <immintrin.h>

#include <cstdint>

namespace goodspeed {
namespace {

constexpr int64_t kMaxK = 256;

// Insert (v, j) into the descending list vals/idx of `count` entries (capacity k); returns the
// new count. An equal value goes after the entries already there.
inline int64_t insert(float* vals, int64_t* idx, int64_t count, int64_t k, float v, int64_t j) {
  int64_t pos = count < k ? count : k - 1;
  while (pos > 0 && vals[pos - 1] < v) {  // when full, slot k - 1 (the smallest) is dropped
    vals[pos] = vals[pos - 1];
    idx[pos] = idx[pos - 1];
    --pos;
  }
  vals[pos] = v;
  idx[pos] = j;
  return count < k ? count + 1 : k;
}

// Whether any of the kBlock entries at p exceeds floor (NaN does not).
struct ScalarBlock {
  static constexpr int64_t kBlock = 16;
  static bool any_above(const float* p, float floor) {
    int any = 0;
    for (int64_t t = 0; t < kBlock; ++t) any |= p[t] > floor;
    return any != 0;
  }
};

struct Avx2Block {
  static constexpr int64_t kBlock = 64;
  __attribute__((target("avx2"))) static bool any_above(const float* p, float floor) {
    __m256 m = _mm256_loadu_ps(p);
    for (int t = 8; t < kBlock; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(p + t));
    return _mm256_movemask_ps(_mm256_cmp_ps(m, _mm256_set1_ps(floor), _CMP_GT_OQ)) != 0;
  }
};

template <typename Block>
void topk_row(const float* row, int64_t vocab, int64_t k, int64_t* out) {
  float vals[kMaxK];
  int64_t count = 0, j = 0;
  for (; j < vocab && count < k; ++j) count = insert(vals, out, count, k, row[j], j);
  for (; j + Block::kBlock <= vocab; j += Block::kBlock) {
    if (!Block::any_above(row + j, vals[k - 1])) continue;
    for (int64_t t = 0; t < Block::kBlock; ++t) {
      if (row[j + t] > vals[k - 1]) insert(vals, out, k, k, row[j + t], j + t);
    }
  }
  for (; j < vocab; ++j) {
    if (row[j] > vals[k - 1]) insert(vals, out, k, k, row[j], j);
  }
}

// x [N, V] float32 -> int64 [N, k]: each row's k largest entries' indices, largest first;
// avx2 false: the portable blocks (tests run both on one machine).
at::Tensor topk_rows(const at::Tensor& x, int64_t k, bool avx2) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [N, V] tensor");
  const int64_t n = x.size(0), vocab = x.size(1);
  TORCH_CHECK(k >= 1 && k <= vocab && k <= kMaxK, "need 1 <= k <= min(V, 256), got ", k);
  at::Tensor out = at::empty({n, k}, x.options().dtype(at::kLong));
  const float* data = x.data_ptr<float>();
  int64_t* ids = out.data_ptr<int64_t>();
  const bool vector = avx2 && __builtin_cpu_supports("avx2");
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (vector) {
        topk_row<Avx2Block>(data + r * vocab, vocab, k, ids + r * k);
      } else {
        topk_row<ScalarBlock>(data + r * vocab, vocab, k, ids + r * k);
      }
    }
  });
  return out;
}

}  // namespace

void register_topk(pybind11::module& m) {
  m.def("topk_rows", &topk_rows,
        "each row's k largest entries' indices, largest first, ties by lower index: int64 [N, k]",
        pybind11::arg("x"), pybind11::arg("k"), pybind11::arg("avx2") = true);
}

}  // namespace goodspeed
