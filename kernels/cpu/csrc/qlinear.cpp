// goodspeed CPU quantized linear: out[M, N] = x[M, K] @ W^T (+ bias), W as GGUF blocks.
//
// Contract (kernels/cpu/__init__.py has the Python side):
//  * W is `blocks` [N, K / elems * bytes] uint8, each row the GGUF's blocks as stored.
//  * Effective weights are exactly gguf.quants.dequantize's; activations and sums are float32,
//    or (act = 1) activations quantized per row and group of 32 to int8 (int8_drivers.h).
//  * Output y[m, n] depends on x[m] and W[n] only, with one reduction order (tiles.h), so a row
//    is bitwise the same alone or in any batch, with any thread count.
//  * Work is split over panels of kPanel output columns with at::parallel_for (so
//    torch.set_num_threads governs it); each weight block is decoded once per call and applied
//    to all M rows (drivers.h), so weights are read from memory once per call.
// isa: 0 = best the CPU has, 1 = scalar, 2 = AVX2 + FMA + F16C (error if the CPU lacks it).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <tuple>

#include "qlinear_core.h"

namespace goodspeed {
namespace {

bool use_avx2(int64_t isa) {
  TORCH_CHECK(isa >= 0 && isa <= 2, "isa must be 0 (auto), 1 (scalar) or 2 (avx2), got ", isa);
  TORCH_CHECK(isa != 2 || cpu_has_avx2(), "isa=2 needs AVX2, FMA and F16C; this CPU lacks them");
  return isa == 2 || (isa == 0 && cpu_has_avx2());
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

// act: 0 = float32 activations, 1 = int8 activations (int8_drivers.h); `packed`: pack_tiles's
// tiles of these weights (AVX-512, float_avx512.h and int8_vnni.h), or None.
void qlinear_out(const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                 const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t isa,
                 int64_t act, const std::optional<at::Tensor>& packed) {
  TORCH_CHECK(act == 0 || act == 1, "act must be 0 (float32) or 1 (int8), got ", act);
  TORCH_CHECK(x.is_cpu() && blocks.is_cpu() && out.is_cpu() && (!bias || bias->is_cpu()),
              "qlinear_out runs on CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "x must be float32 [M, K] with contiguous rows");
  const int64_t M = x.size(0), K = x.size(1), N = blocks.size(0);
  check_weight(blocks, format, K);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.dim() == 2 && out.size(0) == M &&
                  out.size(1) == N && out.stride(1) == 1,
              "out must be float32 [M, N] = [", M, ", ", N, "] with contiguous rows");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                        bias->numel() == N),
              "bias must be a contiguous float32 [N] tensor");
  const Problem p{x.data_ptr<float>(),
                  x.stride(0),
                  M,
                  K,
                  N,
                  blocks.data_ptr<uint8_t>(),
                  blocks.size(1),
                  format,
                  bias ? bias->data_ptr<float>() : nullptr,
                  out.data_ptr<float>(),
                  out.stride(0)};
  const uint8_t* tiles = nullptr;
  if (packed) {
    TORCH_CHECK(isa == 0 && cpu_has_avx512(),
                "packed weights run with isa=0 (auto), on a CPU with AVX-512 (F, BW, VL, DQ, VNNI)");
    check_packed(*packed, format, N, K);
    tiles = packed->data_ptr<uint8_t>();
  }
  run_qlinear(p, use_avx2(isa), act, tiles);
}

// blocks [N, row_bytes] (N a multiple of 16; Q4_0, Q4_1 or Q8_0) -> [N / 16, tile bytes].
at::Tensor pack_tiles(const at::Tensor& blocks, int64_t format, int64_t K) {
  TORCH_CHECK(blocks.is_cpu(), "pack_tiles runs on CPU tensors only");
  check_weight(blocks, format, K);
  TORCH_CHECK(tile_format(format) && blocks.size(0) % kTileCols == 0,
              "pack_tiles takes Q4_0, Q4_1 or Q8_0 weights with a multiple of 16 rows");
  const int64_t N = blocks.size(0), G = K / 32, tile_bytes = G * tile_group_bytes(format);
  at::Tensor packed = at::empty({N / kTileCols, tile_bytes}, blocks.options());
  for (int64_t tile = 0; tile < N / kTileCols; ++tile) {
    pack_tile16(blocks.data_ptr<uint8_t>() + tile * kTileCols * blocks.size(1),
                   blocks.size(1), format, G, packed.data_ptr<uint8_t>() + tile * tile_bytes);
  }
  return packed;
}

void check_packed(const at::Tensor& packed, int64_t format, int64_t N, int64_t K) {
  TORCH_CHECK(tile_format(format) && N % kTileCols == 0, "packed weights: Q4_0, Q4_1 or Q8_0, N % 16 == 0");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == N / kTileCols &&
                  packed.size(1) == K / 32 * tile_group_bytes(format),
              "packed must be pack_tiles's [N / 16, tile bytes] of these weights");
}

at::Tensor dequantize(const at::Tensor& blocks, int64_t format, int64_t K, int64_t isa) {
  TORCH_CHECK(blocks.is_cpu(), "dequantize runs on CPU tensors only");
  check_weight(blocks, format, K);
  const int64_t N = blocks.size(0), row_bytes = blocks.size(1);
  at::Tensor out = at::empty({N, K}, blocks.options().dtype(at::kFloat));
  const bool avx2 = use_avx2(isa);
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

// The int8 path's quantization of x [M, K] (for tests): (q int8 [M, K], d float32 [M, K / 32]).
std::tuple<at::Tensor, at::Tensor> quantize_rows_op(const at::Tensor& x, int64_t isa) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() &&
                  x.size(1) % 32 == 0,
              "x must be a contiguous float32 [M, K] CPU tensor with K a multiple of 32");
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, K / 32}, x.options());
  std::vector<float> sd(M * (K / 32));
  std::vector<int32_t> sums(M * (K / 32));
  auto* quantize = use_avx2(isa) ? quantize_rows_avx2 : quantize_rows;
  quantize(x.data_ptr<float>(), K, M, K, q.data_ptr<int8_t>(), d.data_ptr<float>(), sd.data(),
           sums.data());
  return {q, d};
}

}  // namespace

void register_decode_ops(pybind11::module& m);  // decode_ops.cpp
void register_stack(pybind11::module& m);       // stack.cpp

}  // namespace goodspeed

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "goodspeed CPU kernels: GGUF quantized linear layers and the fused decode-step ops";
  // The long ops release the GIL: the server's event loop runs while the engine computes.
  m.def("qlinear_out", &goodspeed::qlinear_out, "out = x @ dequant(blocks)^T (+ bias)",
        pybind11::call_guard<pybind11::gil_scoped_release>(), pybind11::arg("x"), pybind11::arg("blocks"), pybind11::arg("format"),
        pybind11::arg("bias"), pybind11::arg("out"), pybind11::arg("isa") = 0,
        pybind11::arg("act") = 0, pybind11::arg("packed") = pybind11::none());
  m.def("pack_tiles", &goodspeed::pack_tiles, "blocks -> tiles of 16 columns for the AVX-512 paths",
        pybind11::arg("blocks"), pybind11::arg("format"), pybind11::arg("K"));
  m.def("cpu_has_avx512", []() { return goodspeed::cpu_has_avx512(); },
        "AVX-512 (F, BW, VL, DQ) with VNNI is usable");
  m.def("dequantize", &goodspeed::dequantize, "blocks [N, row_bytes] -> float32 [N, K]",
        pybind11::arg("blocks"), pybind11::arg("format"), pybind11::arg("K"),
        pybind11::arg("isa") = 0);
  m.def("quantize_rows", &goodspeed::quantize_rows_op, "the int8 path's (q, d) of x",
        pybind11::arg("x"), pybind11::arg("isa") = 0);
  m.def("cpu_has_avx2", []() { return goodspeed::cpu_has_avx2(); }, "AVX2, FMA and F16C are usable");
  m.def("panel_width", []() { return goodspeed::kPanel; });
  goodspeed::register_decode_ops(m);
  goodspeed::register_stack(m);
}
