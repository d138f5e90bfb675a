// goodspeed CPU quantized linear: out[M, N] = x[M, K] @ W^T (+ bias), W as GGUF blocks.
//
// Contract (kernels/cpu/__init__.py has the Python side):
//  * W is `blocks` [N, K / elems * bytes] uint8, each row the GGUF's blocks as stored, and/or
//    `packed`: the same weights as tiles of 16 columns (pack_tiles, tile_pack.h).
//  * act = 0: float32 activations, effective weights exactly gguf.quants.dequantize's;
//    act = 1 / 2: each row quantized per group of 32 to int8 / int16 (act_quant.h), exact
//    integer group sums, one float32 order (qint_kernel.h); these need `packed`.
//  * Output y[m, n] depends on x[m] and W[n] only, with one reduction order, so a row is
//    bitwise the same alone or in any batch, with any thread count; with integer activations
//    also on any ISA.
//  * Work is split over column tiles or panels with at::parallel_for (torch.set_num_threads
//    governs it); each weight block is read from memory once per call (per 64 rows for M > 64).
// isa: 0 = best the CPU has, 1 = scalar, 2 = at most AVX2 (+ FMA + F16C), 3 = AVX-512 with VNNI
// (error if the CPU lacks what is asked).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <tuple>
#include <vector>

#include "qlinear_core.h"

namespace goodspeed {
namespace {

Isa checked_isa(int64_t isa) {
  TORCH_CHECK(isa >= 0 && isa <= 3,
              "isa must be 0 (auto), 1 (scalar), 2 (avx2) or 3 (avx512), got ", isa);
  TORCH_CHECK(isa != 2 || cpu_has_avx2(), "isa=2 needs AVX2, FMA and F16C; this CPU lacks them");
  TORCH_CHECK(isa != 3 || cpu_has_avx512(),
              "isa=3 needs AVX-512 (F, BW, VL, DQ) with VNNI; this CPU lacks them");
  return best_isa((Isa)isa);
}

void check_weight(const at::Tensor& blocks, int64_t format, int64_t K) {
  const BlockShape shape = block_shape(format);
  TORCH_CHECK(shape.elems > 0, "unsupported GGUF type ", format,
              "; supported: Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q8_0 (8), Q4_K (12), Q5_K (13), "
              "Q6_K (14)");
  TORCH_CHECK(K % shape.elems == 0, "K = ", K, " is not a multiple of the block size ",
              shape.elems);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              "blocks must be a contiguous uint8 [N, row_bytes] tensor");
  TORCH_CHECK(blocks.size(1) == K / shape.elems * shape.bytes, "blocks rows have ",
              blocks.size(1), " bytes; K = ", K, " needs ", K / shape.elems * shape.bytes);
}

void check_packed(const at::Tensor& packed, int64_t format, int64_t N, int64_t K);

// act: 0 = float32, 1 = int8, 2 = int16 activations. `blocks` (the GGUF rows) and/or `packed`
// (pack_tiles's tiles of the same weights): the integer modes read the tiles, float32 reads
// the tiles on AVX-512 for Q4_0 / Q4_1 / Q8_0 (whole tiles) and the blocks otherwise.
void qlinear_out(const at::Tensor& x, const std::optional<at::Tensor>& blocks, int64_t format,
                 const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t isa,
                 int64_t act, const std::optional<at::Tensor>& packed) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (float32), 1 (int8) or 2 (int16), got ", act);
  TORCH_CHECK(x.is_cpu() && out.is_cpu() && (!blocks || blocks->is_cpu()) &&
                  (!bias || bias->is_cpu()) && (!packed || packed->is_cpu()),
              "qlinear_out runs on CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "x must be float32 [M, K] with contiguous rows");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.dim() == 2 && out.size(0) == x.size(0) &&
                  out.stride(1) == 1,
              "out must be float32 [M, N] with M = x's rows and contiguous rows");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const BlockShape shape = block_shape(format);
  TORCH_CHECK(shape.elems > 0 && K % shape.elems == 0, "unsupported GGUF type ", format,
              " or K = ", K, " not a multiple of its block");
  if (blocks) {
    check_weight(*blocks, format, K);
    TORCH_CHECK(blocks->size(0) == N, "blocks have ", blocks->size(0), " rows, out has ", N);
  }
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                        bias->numel() == N),
              "bias must be a contiguous float32 [N] tensor");
  if (act != 0) TORCH_CHECK(K % 32 == 0, "integer activations need K % 32 == 0, got ", K);
  TORCH_CHECK(act == 0 || packed, "integer activations (act 1, 2) run packed tiles: pass packed");
  if (packed) check_packed(*packed, format, N, K);
  const Isa chosen = checked_isa(isa);
  TORCH_CHECK(act != 0 || blocks || float_uses_tiles(chosen, format, N),
              "float32 activations on this ISA, format or width read the blocks: pass blocks");
  const Problem p{x.data_ptr<float>(),
                  x.stride(0),
                  M,
                  K,
                  N,
                  blocks ? blocks->data_ptr<uint8_t>() : nullptr,
                  blocks ? blocks->size(1) : 0,
                  format,
                  bias ? bias->data_ptr<float>() : nullptr,
                  out.data_ptr<float>(),
                  out.stride(0)};
  run_qlinear(p, chosen, (ActMode)act, packed ? packed->data_ptr<uint8_t>() : nullptr);
}

// blocks [N, row_bytes] -> [ceil(N / 16), tile bytes] (tile_pack.h; a last partial tile is
// padded with zero columns), written into `out` when given (the parts of a fused projection
// packed into one tensor: no concatenated copy of blocks or tiles) and returned.
at::Tensor pack_tiles(const at::Tensor& blocks, int64_t format, int64_t K,
                      std::optional<at::Tensor> out) {
  TORCH_CHECK(blocks.is_cpu(), "pack_tiles runs on CPU tensors only");
  check_weight(blocks, format, K);
  const int64_t N = blocks.size(0), num_tiles = (N + kTileCols - 1) / kTileCols;
  const int64_t bytes = tile_bytes(format, K), row_bytes = blocks.size(1);
  TORCH_CHECK(!out || (out->is_cpu() && out->scalar_type() == at::kByte &&
                       out->is_contiguous() && out->dim() == 2 &&
                       out->size(0) == num_tiles && out->size(1) == bytes),
              "out must be a contiguous uint8 CPU tensor [ceil(N / 16), tile bytes]");
  at::Tensor packed = out ? *out : at::empty({num_tiles, bytes}, blocks.options());
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      pack_tile(src, row_bytes, N, tile * kTileCols, format, K, dst + tile * bytes);
    }
  });
  return packed;
}

// pack_tiles of every blocks[i] into outs[i], in one call: the loader packs a whole model with
// the GIL released once (per-tensor calls waited for the GIL behind the tokenizer's thread).
void pack_tiles_into(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& formats,
                     const std::vector<int64_t>& Ks, const std::vector<at::Tensor>& outs) {
  TORCH_CHECK(formats.size() == blocks.size() && Ks.size() == blocks.size() &&
                  outs.size() == blocks.size(),
              "pack_tiles_into needs as many formats, Ks and outs as blocks");
  for (size_t i = 0; i < blocks.size(); ++i) pack_tiles(blocks[i], formats[i], Ks[i], outs[i]);
}

void check_packed(const at::Tensor& packed, int64_t format, int64_t N, int64_t K) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == (N + kTileCols - 1) / kTileCols &&
                  packed.size(1) == tile_bytes(format, K),
              "packed must be pack_tiles's [ceil(N / 16), tile bytes] of these weights");
}

at::Tensor dequantize(const at::Tensor& blocks, int64_t format, int64_t K, int64_t isa) {
  TORCH_CHECK(blocks.is_cpu(), "dequantize runs on CPU tensors only");
  check_weight(blocks, format, K);
  const int64_t N = blocks.size(0), row_bytes = blocks.size(1);
  at::Tensor out = at::empty({N, K}, blocks.options().dtype(at::kFloat));
  const bool avx2 = checked_isa(isa) != Isa::kScalar;
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      if (!avx2) {
        dequant_row_scalar(format, src + n * row_bytes, K, dst + n * K, 8);
        continue;
      }
      with_format(format, [&](auto f) {
        dequant_row_avx2<decltype(f)>(src + n * row_bytes, K, dst + n * K, 8);
      });
    }
  });
  return out;
}

// The integer modes' quantization of x [M, K] (for tests): (hi int8 [M, K], lo int8 [M, K]
// (empty for int8), d float32 [M, K / 32], sum16 int32 [M, K / 16]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_rows_op(const at::Tensor& x,
                                                                            int64_t act,
                                                                            int64_t isa) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() &&
                  x.size(1) % 32 == 0,
              "x must be a contiguous float32 [M, K] CPU tensor with K a multiple of 32");
  TORCH_CHECK(act == 1 || act == 2, "act must be 1 (int8) or 2 (int16), got ", act);
  const int64_t M = x.size(0), K = x.size(1);
  const bool int16 = act == 2;
  at::Tensor hi = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor lo = at::empty({int16 ? M : 0, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, K / 32}, x.options());
  at::Tensor sum16 = at::empty({M, K / 16}, x.options().dtype(at::kInt));
  quantize_acts(x.data_ptr<float>(), K, M, K, (ActMode)act, checked_isa(isa) != Isa::kScalar,
                hi.data_ptr<int8_t>(), int16 ? lo.data_ptr<int8_t>() : nullptr,
                d.data_ptr<float>(), sum16.data_ptr<int32_t>());
  return {hi, lo, d, sum16};
}

}  // namespace

void register_decode_ops(pybind11::module& m);  // decode_ops.cpp
void register_stack(pybind11::module& m);       // stack.cpp
void register_race(pybind11::module& m);        // race.cpp
void register_ngram_index(pybind11::module& m);  // ngram_index.cpp
void register_topk(pybind11::module& m);         // topk.cpp

}  // namespace goodspeed

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "goodspeed CPU kernels: GGUF quantized linear layers and the fused decode-step ops";
  // The long ops release the GIL: the server's event loop runs while the engine computes.
  m.def("qlinear_out", &goodspeed::qlinear_out, "out = x @ dequant(blocks)^T (+ bias)",
        pybind11::call_guard<pybind11::gil_scoped_release>(), pybind11::arg("x"), pybind11::arg("blocks"), pybind11::arg("format"),
        pybind11::arg("bias"), pybind11::arg("out"), pybind11::arg("isa") = 0,
        pybind11::arg("act") = 0, pybind11::arg("packed") = pybind11::none());
  m.def("pack_tiles", &goodspeed::pack_tiles, "blocks -> tiles of 16 columns (tile_pack.h)",
        pybind11::call_guard<pybind11::gil_scoped_release>(), pybind11::arg("blocks"),
        pybind11::arg("format"), pybind11::arg("K"), pybind11::arg("out") = pybind11::none());
  m.def("pack_tiles_into", &goodspeed::pack_tiles_into, "pack_tiles of each blocks into its out",
        pybind11::call_guard<pybind11::gil_scoped_release>(), pybind11::arg("blocks"),
        pybind11::arg("formats"), pybind11::arg("Ks"), pybind11::arg("outs"));
  m.def("tile_bytes", &goodspeed::tile_bytes, "bytes of one tile of K inputs (tile_pack.h)",
        pybind11::arg("format"), pybind11::arg("K"));
  m.def("cpu_has_avx512", []() { return goodspeed::cpu_has_avx512(); },
        "AVX-512 (F, BW, VL, DQ) with VNNI is usable");
  m.def("dequantize", &goodspeed::dequantize, "blocks [N, row_bytes] -> float32 [N, K]",
        pybind11::arg("blocks"), pybind11::arg("format"), pybind11::arg("K"),
        pybind11::arg("isa") = 0);
  m.def("quantize_rows", &goodspeed::quantize_rows_op, "(hi, lo, d, sum16) of x for act 1 or 2",
        pybind11::arg("x"), pybind11::arg("act"), pybind11::arg("isa") = 0);
  m.def("cpu_has_avx2", []() { return goodspeed::cpu_has_avx2(); }, "AVX2, FMA and F16C are usable");
  m.def("linear_isa", []() { return (int64_t)goodspeed::best_isa(); },
        "the ISA the linear kernels run (1 scalar, 2 AVX2, 3 AVX-512), after any cap");
  m.def(
      "set_linear_isa_cap",
      [](int64_t isa) {
        TORCH_CHECK(isa >= 0 && isa <= 3, "isa must be 0 (none), 1 (scalar), 2 (avx2) or 3");
        goodspeed::linear_isa_cap().store(isa);
      },
      "cap the linear kernels' ISA for the whole process (0: no cap; tests)", pybind11::arg("isa"));
  m.def("panel_width", []() { return goodspeed::kPanel; });
  goodspeed::register_decode_ops(m);
  goodspeed::register_race(m);
  goodspeed::register_ngram_index(m);
  goodspeed::register_topk(m);
  goodspeed::register_stack(m);
}
