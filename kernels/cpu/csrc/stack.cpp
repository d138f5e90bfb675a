// A Llama-family decoder stack in one native call: every layer's RMSNorm(+residual), fused QKV
// linear, RoPE, paged attention, O linear, RMSNorm(+residual), gate|up linear, SiLU·mul and
// down linear, then the final norm, with no Python between the ops. The families' extras as
// the per-op forward runs them: QK-norm before RoPE (Qwen3, Gemma 3), sandwich norms (Gemma:
// the attention and MLP outputs normed before their residual adds), GeGLU, a second RoPE table
// for sliding layers, a sliding window per layer.
//
// It runs the very cores the per-op Python path runs (qlinear_core.h, decode_core.h) in the
// same order on the same values, so its output is bitwise that path's (tested); what it saves
// is the interpreter, module dispatch and tensor allocation around ~10 ops a layer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_batch.h"
#include "qlinear_core.h"

namespace goodspeed {
namespace {

// Phases of a layer, for the optional timings (benchmarks/lean_step.py --compare stack).
enum Phase { kNorms, kQkv, kRope, kAttention, kO, kGateUp, kSilu, kDown, kPhases };

// Adds the seconds since the last lap to a phase's slot; does nothing without slots.
class Clock {
 public:
  explicit Clock(double* slots) : slots_(slots), last_(now()) {}
  void lap(Phase phase) {
    if (slots_ == nullptr) return;
    const double t = now();
    slots_[phase] += t - last_;
    last_ = t;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  double* slots_;
  double last_;
};

// One run of output columns stored in one GGUF format: (blocks [cols, row_bytes], format,
// first column, number of columns, the blocks packed into tiles (tile_pack.h) or None; the
// integer activation modes need the tiles).
using Run = std::tuple<std::optional<at::Tensor>, int64_t, int64_t, int64_t,
                       std::optional<at::Tensor>>;

struct QuantizedLinear {
  std::vector<Run> runs;
  std::optional<at::Tensor> bias;  // [N] float32
  int64_t K = 0, N = 0;
};

struct Layer {
  at::Tensor input_norm, post_norm;  // [hidden] float32
  QuantizedLinear qkv, o, gate_up, down;
  int64_t window;  // sliding-window length, 0: full attention
  std::optional<at::Tensor> q_norm, k_norm;  // [head_dim] float32: QK-norm, or none
  // Sandwich norms: post_norm norms the attention output, pre_ffn_norm is the MLP's input
  // norm, post_ffn_norm norms the MLP output; none: post_norm is the MLP's input norm.
  std::optional<at::Tensor> pre_ffn_norm, post_ffn_norm;
  bool local_rope;  // the sliding layers' RoPE table
};

QuantizedLinear make_linear(std::vector<Run> runs, std::optional<at::Tensor> bias, int64_t K) {
  QuantizedLinear linear{std::move(runs), std::move(bias), K, 0};
  for (const Run& run : linear.runs) {
    const auto& [blocks, format, col0, cols, packed] = run;
    const BlockShape shape = block_shape(format);
    TORCH_CHECK(shape.elems > 0 && K % shape.elems == 0, "unsupported format or width");
    TORCH_CHECK(blocks || packed, "a run needs its blocks or its tiles");
    TORCH_CHECK(!blocks || (blocks->scalar_type() == at::kByte && blocks->is_contiguous() &&
                            blocks->dim() == 2 && blocks->size(0) == cols &&
                            blocks->size(1) == K / shape.elems * shape.bytes),
                "a run's blocks must be contiguous uint8 [cols, row_bytes]");
    TORCH_CHECK(col0 == linear.N, "runs must cover the output columns in order");
    TORCH_CHECK(!packed || (packed->is_contiguous() &&
                            packed->size(0) == (cols + kTileCols - 1) / kTileCols &&
                            packed->size(1) == tile_bytes(format, K)),
                "packed weights must be pack_tiles's tiles of the run");
    linear.N += cols;
  }
  TORCH_CHECK(!linear.bias || (linear.bias->scalar_type() == at::kFloat &&
                               linear.bias->is_contiguous() && linear.bias->numel() == linear.N),
              "bias must be contiguous float32 [N]");
  return linear;
}

class DecoderStack {
 public:
  DecoderStack(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
               int64_t intermediate, double eps, at::Tensor cos, at::Tensor sin_signed,
               at::Tensor final_norm, int64_t act, bool gelu,
               std::optional<at::Tensor> local_cos, std::optional<at::Tensor> local_sin)
      : C_(hidden), H_(heads), Hkv_(kv_heads), D_(head_dim), I_(intermediate), eps_((float)eps),
        cos_(std::move(cos)), sin_(std::move(sin_signed)), final_norm_(std::move(final_norm)),
        act_((ActMode)act), gelu_(gelu), local_cos_(std::move(local_cos)),
        local_sin_(std::move(local_sin)) {
    TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (float32), 1 (int8) or 2 (int16)");
    TORCH_CHECK(D_ % 2 == 0 && D_ <= 1024 && H_ % Hkv_ == 0 && H_ / Hkv_ <= 64, "head shapes");
    TORCH_CHECK(cos_.is_contiguous() && sin_.is_contiguous() && cos_.size(1) == D_, "tables");
    TORCH_CHECK(local_cos_.has_value() == local_sin_.has_value() &&
                    (!local_cos_ || (local_cos_->is_contiguous() && local_sin_->is_contiguous() &&
                                     local_cos_->sizes() == cos_.sizes())),
                "local tables: both or neither, shaped like the global ones");
  }

  void add_layer(at::Tensor input_norm, at::Tensor post_norm, std::vector<Run> qkv,
                 std::optional<at::Tensor> qkv_bias, std::vector<Run> o,
                 std::optional<at::Tensor> o_bias, std::vector<Run> gate_up,
                 std::vector<Run> down, int64_t window, std::optional<at::Tensor> q_norm,
                 std::optional<at::Tensor> k_norm, std::optional<at::Tensor> pre_ffn_norm,
                 std::optional<at::Tensor> post_ffn_norm, bool local_rope) {
    TORCH_CHECK(window >= 0, "window must be >= 0");
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value() &&
                    (!q_norm || (q_norm->numel() == D_ && k_norm->numel() == D_)),
                "q_norm and k_norm: both [head_dim] or neither");
    TORCH_CHECK(pre_ffn_norm.has_value() == post_ffn_norm.has_value(),
                "pre_ffn_norm and post_ffn_norm: both or neither");
    TORCH_CHECK(!local_rope || local_cos_, "local_rope needs the local tables");
    Layer layer{std::move(input_norm),
                std::move(post_norm),
                make_linear(std::move(qkv), std::move(qkv_bias), C_),
                make_linear(std::move(o), std::move(o_bias), H_ * D_),
                make_linear(std::move(gate_up), std::nullopt, C_),
                make_linear(std::move(down), std::nullopt, I_),
                window,
                std::move(q_norm),
                std::move(k_norm),
                std::move(pre_ffn_norm),
                std::move(post_ffn_norm),
                local_rope};
    for (const QuantizedLinear* w : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) {
      for (const Run& run : w->runs) {
        TORCH_CHECK(act_ == ActMode::kFloat32 || std::get<4>(run),
                    "integer activations need every run's packed tiles");
      }
    }
    TORCH_CHECK(layer.qkv.N == (H_ + 2 * Hkv_) * D_ && layer.o.N == C_ &&
                    layer.gate_up.N == 2 * I_ && layer.down.N == C_,
                "linear shapes do not match the model's");
    layers_.push_back(std::move(layer));
  }

  // residual [T, hidden] (the embeddings; overwritten) -> final-norm hidden states [T, hidden].
  // caches[i], slots, block_tables, tokens, mask: as paged_attention_out takes them.
  // timings: float64 [kPhases] to add each phase's seconds to (benchmarks), or None.
  // window_slots, window_block_tables: the sliding layers' own pool (their caches[i] are that
  // pool's), or None: every layer reads slots and block_tables.
  at::Tensor forward(at::Tensor& residual, const at::Tensor& positions,
                     const std::vector<at::Tensor>& caches, const at::Tensor& slots,
                     const at::Tensor& block_tables, const at::Tensor& tokens,
                     const std::optional<at::Tensor>& mask, double scale, int64_t num_layers,
                     const std::optional<at::Tensor>& timings,
                     const std::optional<at::Tensor>& window_slots,
                     const std::optional<at::Tensor>& window_block_tables) {
    const int64_t T = residual.size(0);
    check_inputs(residual, positions, caches, num_layers);
    TORCH_CHECK(!timings || (timings->scalar_type() == at::kDouble && timings->is_contiguous() &&
                             timings->numel() == kPhases),
                "timings must be a contiguous float64 [", kPhases, "] tensor");
    Clock clock(timings ? timings->data_ptr<double>() : nullptr);
    const AttentionBatch batch = attention_batch(slots, block_tables, tokens, mask, T);
    TORCH_CHECK(window_slots.has_value() == window_block_tables.has_value(),
                "window_slots and window_block_tables come together");
    const AttentionBatch window_batch =
        window_slots ? attention_batch(*window_slots, *window_block_tables, tokens, mask, T)
                     : batch;
    const int64_t QKV = (H_ + 2 * Hkv_) * D_;
    auto buffer = [&](int64_t cols) { return at::empty({T, cols}, residual.options()); };
    at::Tensor h = buffer(C_), qkv = buffer(QKV), attended = buffer(H_ * D_), o = buffer(C_);
    at::Tensor gate_up = buffer(2 * I_), act = buffer(I_), delta = buffer(C_), out = buffer(C_);
    at::Tensor mlp_out = buffer(C_);  // the MLP output before its norm (sandwich norms)
    const Mat res = mat(residual), hm = mat(h), om = mat(o), dm = mat(delta), mm = mat(mlp_out);
    const int64_t* pos = positions.data_ptr<int64_t>();
    for (int64_t i = 0; i < num_layers; ++i) {
      const Layer& layer = layers_[i];
      rms_norm_rows(res, i == 0 ? nullptr : &dm, layer.input_norm.data_ptr<float>(), eps_, hm, T,
                    C_);
      clock.lap(kNorms);
      linear(layer.qkv, hm, mat(qkv), T);
      clock.lap(kQkv);
      float* qkv_data = qkv.data_ptr<float>();
      if (layer.q_norm) {
        norm_heads_rows(qkv_data, QKV, T, 0, H_, D_, layer.q_norm->data_ptr<float>(), eps_);
        norm_heads_rows(qkv_data, QKV, T, H_, Hkv_, D_, layer.k_norm->data_ptr<float>(), eps_);
        clock.lap(kNorms);
      }
      const at::Tensor& cos = layer.local_rope ? *local_cos_ : cos_;
      const at::Tensor& sin = layer.local_rope ? *local_sin_ : sin_;
      rope_rows(qkv_data, QKV, D_, T, H_ + Hkv_, D_, pos, cos.data_ptr<float>(),
                sin.data_ptr<float>());
      clock.lap(kRope);
      with_paged(caches[i], Hkv_, D_, [&](const auto& cache) {
        paged_attention(cache, Heads{qkv_data, QKV, D_}, Heads{qkv_data + H_ * D_, QKV, D_},
                        Heads{qkv_data + (H_ + Hkv_) * D_, QKV, D_}, H_,
                        layer.window > 0 ? window_batch : batch, (float)scale,
                        attended.data_ptr<float>(), layer.window);
      });
      clock.lap(kAttention);
      linear(layer.o, mat(attended), om, T);
      clock.lap(kO);
      if (layer.pre_ffn_norm) {  // o <- norm(o); residual += o; h = norm(residual)
        rms_norm_rows(om, nullptr, layer.post_norm.data_ptr<float>(), eps_, om, T, C_);
        rms_norm_rows(res, &om, layer.pre_ffn_norm->data_ptr<float>(), eps_, hm, T, C_);
      } else {
        rms_norm_rows(res, &om, layer.post_norm.data_ptr<float>(), eps_, hm, T, C_);
      }
      clock.lap(kNorms);
      linear(layer.gate_up, hm, mat(gate_up), T);
      clock.lap(kGateUp);
      act_mul_rows(mat(gate_up), mat(act), T, I_, gelu_);
      clock.lap(kSilu);
      if (layer.post_ffn_norm) {  // delta = norm(mlp output)
        linear(layer.down, mat(act), mm, T);
        clock.lap(kDown);
        rms_norm_rows(mm, nullptr, layer.post_ffn_norm->data_ptr<float>(), eps_, dm, T, C_);
        clock.lap(kNorms);
      } else {
        linear(layer.down, mat(act), dm, T);
        clock.lap(kDown);
      }
    }
    rms_norm_rows(res, num_layers > 0 ? &dm : nullptr, final_norm_.data_ptr<float>(), eps_,
                  mat(out), T, C_);
    return out;
  }

  int64_t num_layers() const { return (int64_t)layers_.size(); }

 private:
  static Mat mat(const at::Tensor& t) { return Mat{t.data_ptr<float>(), t.stride(0)}; }

  // Integer activations are quantized once for all the runs of a layer.
  void linear(const QuantizedLinear& w, Mat x, Mat out, int64_t T) const {
    const Isa isa = best_isa();
    std::optional<QuantizedActs> acts;
    if (act_ != ActMode::kFloat32) acts.emplace(x.data, x.stride, T, w.K, act_);
    for (const Run& run : w.runs) {
      const auto& [blocks, format, col0, cols, packed] = run;
      TORCH_CHECK(act_ != ActMode::kFloat32 || blocks || float_uses_tiles(isa, format, cols),
                  "float32 activations on this ISA need the blocks of every run");
      const Problem p{x.data, x.stride, T, w.K, cols,
                      blocks ? blocks->data_ptr<uint8_t>() : nullptr, blocks ? blocks->size(1) : 0,
                      format, w.bias ? w.bias->data_ptr<float>() + col0 : nullptr,
                      out.data + col0, out.stride};
      run_qlinear(p, isa, act_, packed ? packed->data_ptr<uint8_t>() : nullptr,
                  acts ? &acts->view() : nullptr);
    }
  }

  void check_inputs(const at::Tensor& residual, const at::Tensor& positions,
                    const std::vector<at::Tensor>& caches, int64_t num_layers) const {
    TORCH_CHECK(residual.is_cpu() && residual.scalar_type() == at::kFloat &&
                    residual.dim() == 2 && residual.is_contiguous() && residual.size(1) == C_,
                "residual must be contiguous float32 [T, hidden]");
    const int64_t T = residual.size(0);
    TORCH_CHECK(num_layers >= 0 && num_layers <= (int64_t)layers_.size() &&
                    (int64_t)caches.size() >= num_layers,
                "num_layers out of range, or too few caches");
    for (int64_t i = 0; i < num_layers; ++i) {
      const at::Tensor& c = caches[i];
      TORCH_CHECK(is_kv_cache(c, Hkv_, D_),
                  "caches must be contiguous float32, float16 or bfloat16 [blocks, 2, "
                  "block_size, kv_heads, D]");
    }
    TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                    positions.numel() == T,
                "positions must be contiguous int64 [T]");
    const int64_t* pos = positions.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      TORCH_CHECK(pos[t] >= 0 && pos[t] < cos_.size(0), "position ", pos[t], " out of range");
    }
  }

  int64_t C_, H_, Hkv_, D_, I_;
  float eps_;
  at::Tensor cos_, sin_, final_norm_;
  ActMode act_;
  bool gelu_;  // GeGLU (gelu_tanh) instead of SwiGLU
  std::optional<at::Tensor> local_cos_, local_sin_;
  std::vector<Layer> layers_;
};

}  // namespace

void register_stack(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<DecoderStack>(m, "DecoderStack")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor,
                    at::Tensor, int64_t, bool, std::optional<at::Tensor>,
                    std::optional<at::Tensor>>(),
           py::arg("hidden"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("intermediate"), py::arg("eps"), py::arg("cos"), py::arg("sin_signed"),
           py::arg("final_norm"), py::arg("act"), py::arg("gelu") = false,
           py::arg("local_cos") = py::none(), py::arg("local_sin") = py::none())
      .def("add_layer", &DecoderStack::add_layer, py::arg("input_norm"), py::arg("post_norm"),
           py::arg("qkv"), py::arg("qkv_bias"), py::arg("o"), py::arg("o_bias"),
           py::arg("gate_up"), py::arg("down"), py::arg("window") = 0,
           py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none(),
           py::arg("pre_ffn_norm") = py::none(), py::arg("post_ffn_norm") = py::none(),
           py::arg("local_rope") = false)
      .def("forward", &DecoderStack::forward, py::call_guard<py::gil_scoped_release>(),
           py::arg("residual"), py::arg("positions"), py::arg("caches"), py::arg("slots"),
           py::arg("block_tables"), py::arg("tokens"), py::arg("mask"), py::arg("scale"),
           py::arg("num_layers"), py::arg("timings") = py::none(),
           py::arg("window_slots") = py::none(), py::arg("window_block_tables") = py::none())
      .def_property_readonly("num_layers", &DecoderStack::num_layers)
      .def_property_readonly_static("phases", [](py::object) {
        return std::vector<std::string>{"norms", "qkv", "rope", "attention", "o", "gate_up",
                                        "silu_mul", "down"};
      });
}

}  // namespace goodspeed
