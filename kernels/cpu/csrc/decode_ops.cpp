// Python bindings of the decode-step ops (decode_core.h): checks on the tensors, then the cores.
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "attention_batch.h"

namespace goodspeed {
namespace {

void check_float(const at::Tensor& t, int64_t dims, const char* name) {
  TORCH_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.dim() == dims && t.stride(-1) == 1,
              name, " must be a CPU float32 tensor of ", dims, " dims with a contiguous last dim");
}

Mat mat(const at::Tensor& t) { return Mat{t.data_ptr<float>(), t.stride(0)}; }

Heads heads(const at::Tensor& t) { return Heads{t.data_ptr<float>(), t.stride(0), t.stride(1)}; }

void rms_norm_out(at::Tensor& residual, const std::optional<at::Tensor>& delta,
                  const at::Tensor& weight, double eps, at::Tensor& out) {
  check_float(residual, 2, "residual");
  check_float(out, 2, "out");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == at::kFloat, "weight: float32");
  const int64_t T = residual.size(0), C = residual.size(1);
  TORCH_CHECK(weight.numel() == C && out.size(0) == T && out.size(1) == C, "shape mismatch");
  Mat d{nullptr, 0};
  if (delta) {
    check_float(*delta, 2, "delta");
    TORCH_CHECK(delta->size(0) == T && delta->size(1) == C, "delta must match residual");
    d = mat(*delta);
  }
  rms_norm_rows(mat(residual), delta ? &d : nullptr, weight.data_ptr<float>(), (float)eps,
                mat(out), T, C);
}

void rope_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos,
           const at::Tensor& sin_signed) {
  check_float(x, 3, "x");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "positions");
  TORCH_CHECK(cos.is_contiguous() && sin_signed.is_contiguous() && cos.dim() == 2, "tables");
  const int64_t T = x.size(0), D = x.size(2);
  TORCH_CHECK(cos.size(1) == D && D % 2 == 0 && D <= 1024, "head_dim must be even, <= 1024");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " out of range");
  }
  rope_rows(x.data_ptr<float>(), x.stride(0), x.stride(1), T, x.size(1), D, pos,
            cos.data_ptr<float>(), sin_signed.data_ptr<float>());
}

void act_mul_out(const at::Tensor& gate_up, at::Tensor& out, bool gelu) {
  check_float(gate_up, 2, "gate_up");
  check_float(out, 2, "out");
  const int64_t T = gate_up.size(0), I = out.size(1);
  TORCH_CHECK(gate_up.size(1) == 2 * I && out.size(0) == T, "gate_up must be [T, 2 * out cols]");
  act_mul_rows(mat(gate_up), mat(out), T, I, gelu);
}

void silu_mul_out(const at::Tensor& gate_up, at::Tensor& out) { act_mul_out(gate_up, out, false); }

void gelu_tanh_mul_out(const at::Tensor& gate_up, at::Tensor& out) {
  act_mul_out(gate_up, out, true);
}

// q [T, H, D], k/v [T, Hkv, D] (last dims contiguous), cache [blocks, 2, bs, Hkv, D],
// slots [T] int64 (where this step's k/v go), block_tables [R, max_blocks] int32,
// tokens [T, 4] int32 = (request, history length before the step's tokens, index among the
// request's new tokens, request's number of new tokens), mask [T, max_q_len] uint8 or None,
// window: a sliding window of that many positions (0: full attention).
void paged_attention_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         at::Tensor& cache, const at::Tensor& slots,
                         const at::Tensor& block_tables, const at::Tensor& tokens,
                         const std::optional<at::Tensor>& mask, double scale, at::Tensor& out,
                         int64_t window) {
  check_float(q, 3, "q");
  check_float(k, 3, "k");
  check_float(v, 3, "v");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes(), "out must be contiguous like q");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1);
  TORCH_CHECK(H % Hkv == 0 && H / Hkv <= 64, "head shapes (at most 64 query heads per KV head)");
  const AttentionBatch batch = attention_batch(slots, block_tables, tokens, mask, T);
  TORCH_CHECK(window >= 0, "window must be >= 0");
  with_paged(cache, Hkv, D, [&](const auto& c) {
    paged_attention(c, heads(q), heads(k), heads(v), H, batch, (float)scale,
                    out.data_ptr<float>(), window);
  });
}

}  // namespace

void register_decode_ops(pybind11::module& m) {
  m.def("set_attention_isa_cap",
        [](int cap) {
          TORCH_CHECK(cap >= 0 && cap <= 2, "attention ISA cap: 0 scalar, 1 AVX2, 2 AVX-512");
          attention_isa_cap.store(cap);
        },
        "the widest attention path this process takes (tests: cover the narrower ones)",
        pybind11::arg("cap"));
  m.def("rms_norm_out", &rms_norm_out, "residual (+= delta); out = weight * rmsnorm(residual)",
        pybind11::arg("residual"), pybind11::arg("delta"), pybind11::arg("weight"),
        pybind11::arg("eps"), pybind11::arg("out"));
  m.def("rope_", &rope_, "rotate-half RoPE in place on x [T, heads, D]", pybind11::arg("x"),
        pybind11::arg("positions"), pybind11::arg("cos"), pybind11::arg("sin_signed"));
  m.def("gelu_tanh_mul_out", &gelu_tanh_mul_out, "out = gelu_tanh(gate) * up",
        pybind11::arg("gate_up"), pybind11::arg("out"));
  m.def("silu_mul_out", &silu_mul_out, "out = silu(gate) * up", pybind11::arg("gate_up"),
        pybind11::arg("out"));
  m.def("paged_attention_out", &paged_attention_out,
        "write k/v into the paged cache, then attend each query over the keys it sees",
        pybind11::call_guard<pybind11::gil_scoped_release>(), pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("cache"), pybind11::arg("slots"),
        pybind11::arg("block_tables"), pybind11::arg("tokens"), pybind11::arg("mask"),
        pybind11::arg("scale"), pybind11::arg("out"), pybind11::arg("window") = 0);
}

}  // namespace goodspeed
