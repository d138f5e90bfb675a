// One quantized linear call on raw pointers (qlinear.cpp binds it for Python; stack.cpp calls it
// layer after layer). The contract is qlinear.cpp's: a row's result depends on that row only.
#pragma once

#include <ATen/Parallel.h>

#include <vector>

#include "drivers.h"
#include "int8_drivers.h"
#include "float_avx512.h"
#include "int8_vnni.h"

namespace goodspeed {

inline bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

inline void run_int8(Problem p, bool avx2) {
  const QuantizedRows rows(p.x, p.x_stride, p.M, p.K, avx2);
  const int64_t num_panels = (p.N + kPanel - 1) / kPanel;
  if (!avx2) {  // the float kernels on the quantized rows' values
    thread_local std::vector<float> values;
    dequantize_rows(rows.view, p.M, values);
    p.x = values.data();
    p.x_stride = p.K;
    at::parallel_for(0, num_panels, 1, [&](int64_t begin, int64_t end) {
      run_panels_scalar(p, begin, end);
    });
    return;
  }
  at::parallel_for(0, num_panels, 1, [&](int64_t begin, int64_t end) {
    with_int8_format(p.format, [&](auto f) { run_int8_panels<decltype(f)>(p, rows.view, begin, end); });
  });
}

// act: 0 = float32 activations, 1 = int8 activations (int8_drivers.h). p is already checked.
// `packed`: the weights repacked into AVX-512 tiles of 16 columns (int8_vnni.h), or nullptr;
// used whenever given (the caller packs only where the CPU runs them): float_avx512.h for
// float32 activations, int8_vnni.h for int8.
inline void run_qlinear(const Problem& p, bool avx2, int64_t act, const uint8_t* packed = nullptr) {
  if (p.M == 0 || p.N == 0) return;
  if (packed != nullptr) return act == 1 ? run_vnni(p, packed) : run_f32_packed(p, packed);
  if (act == 1) return run_int8(p, avx2);
  const int64_t num_panels = (p.N + kPanel - 1) / kPanel;
  at::parallel_for(0, num_panels, 1, [&](int64_t begin, int64_t end) {
    if (!avx2) return run_panels_scalar(p, begin, end);
    with_format(p.format, [&](auto f) { run_panels_avx2<decltype(f)>(p, begin, end); });
  });
}

}  // namespace goodspeed
