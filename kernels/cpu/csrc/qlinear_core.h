// One quantized linear call on raw pointers (qlinear.cpp binds it for Python; stack.cpp calls it
// layer after layer). The contract is qlinear.cpp's: a row's result depends on that row only.
//
// Paths, by activation mode:
//  * int16 / int8: the rows are quantized (act_quant.h), then the packed tiles run the integer
//    kernels (qint_kernel.h) on the best ISA the caller allows: the same bytes on every ISA.
//  * float32: Q4_0 / Q4_1 / Q8_0 tiles on AVX-512 (float_avx512.h) where the caller passes them;
//    otherwise the blocks as stored, fused or panelled on AVX2 (drivers.h), or scalar.
#pragma once

#include <ATen/Parallel.h>

#include "drivers.h"
#include "float_avx512.h"
#include "qint.h"

namespace goodspeed {

// `acts`: the rows already quantized (a layer's runs share one quantization), or nullptr.
inline void run_qint_problem(const Problem& p, const Acts& acts, const uint8_t* packed, Isa isa) {
  run_qint(QintJob{p.format, packed, acts, p.out, p.out_stride, p.bias, p.N}, isa);
}

// Whether float32 activations run tiles here (else the blocks as stored).
inline bool float_uses_tiles(Isa isa, int64_t format, int64_t N) {
  return isa == Isa::kAvx512 && f32_tile_format(format) && N % kTileCols == 0;
}

inline void run_float(const Problem& p, Isa isa, const uint8_t* packed) {
  if (packed != nullptr && float_uses_tiles(isa, p.format, p.N)) return run_f32_packed(p, packed);
  const bool avx2 = isa != Isa::kScalar;
  const int64_t num_panels = (p.N + kPanel - 1) / kPanel;
  at::parallel_for(0, num_panels, 1, [&](int64_t begin, int64_t end) {
    if (!avx2) return run_panels_scalar(p, begin, end);
    with_format(p.format, [&](auto f) { run_panels_avx2<decltype(f)>(p, begin, end); });
  });
}

// `isa` must be one the CPU has (best_isa). `packed`: pack_tile's tiles of these weights, needed
// by the integer modes and used by float32 on AVX-512 for its three formats; or nullptr.
inline void run_qlinear(const Problem& p, Isa isa, ActMode act, const uint8_t* packed,
                        const Acts* acts = nullptr) {
  if (p.M == 0 || p.N == 0) return;
  if (act == ActMode::kFloat32) return run_float(p, isa, packed);
  if (acts != nullptr) return run_qint_problem(p, *acts, packed, isa);
  const QuantizedActs own(p.x, p.x_stride, p.M, p.K, act);
  run_qint_problem(p, own.view(), packed, isa);
}

}  // namespace goodspeed
