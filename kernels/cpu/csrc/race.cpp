// Counter-based race noise for sampling (kernels/sampling.py): the uniform of token x in the
// row keyed `key` (a hash of the request's seed and the token's position) is
//     u = (splitmix64(key ^ (x * golden)) >> 41 + 0.5) / 2^23,
// a float32 in (0, 1) that holds those 23 bits exactly. One pass over the vocabulary; the
// PyTorch twin (kernels/sampling.py: _race_uniforms_torch) computes the same bits.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

namespace goodspeed {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t splitmix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// keys [N] int64 (the bits of a uint64) -> uniforms [N, vocab_size] float32.
at::Tensor race_uniforms(const at::Tensor& keys, int64_t vocab_size) {
  TORCH_CHECK(keys.dim() == 1 && keys.scalar_type() == at::kLong && keys.is_contiguous(),
              "keys must be a contiguous int64 [N] tensor");
  TORCH_CHECK(vocab_size > 0, "vocab_size must be positive");
  const int64_t n = keys.size(0);
  at::Tensor out = at::empty({n, vocab_size}, keys.options().dtype(at::kFloat));
  const int64_t* key = keys.data_ptr<int64_t>();
  float* u = out.data_ptr<float>();
  constexpr float kScale = 1.0f / 8388608.0f;  // 2^-23
  at::parallel_for(0, n * vocab_size, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = i / vocab_size, token = i - row * vocab_size;
      const uint64_t bits =
          splitmix64(static_cast<uint64_t>(key[row]) ^ (static_cast<uint64_t>(token) * kGolden));
      u[i] = (static_cast<float>(bits >> 41) + 0.5f) * kScale;
    }
  });
  return out;
}

}  // namespace

void register_race(pybind11::module& m) {
  m.def("race_uniforms", &race_uniforms,
        "uniforms [N, V] float32 of the sampling race, from per-row keys [N] int64",
        pybind11::arg("keys"), pybind11::arg("vocab_size"));
}

}  // namespace goodspeed
