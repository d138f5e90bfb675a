// Linear layers with integer activations over packed tiles: the job the three ISA translation
// units (qint_avx512.cpp, qint_avx2.cpp, qint_scalar.cpp) run, and the driver that quantizes the
// rows once and splits the tiles over threads. The arithmetic is qint_kernel.h's.
#pragma once

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>

#include "act_quant.h"
#include "common.h"
#include "tile_pack.h"

namespace goodspeed {

enum class Isa : int64_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

inline bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

// AVX-512 (F, BW, VL, DQ) with VNNI: what the AVX-512 tile paths use.
inline bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}

// Intel's cores, where the AVX-512 tiles ask for the next tile into L2 at every row count
// (qint_avx512.cpp's stream_rows); read once.
inline bool cpu_is_intel() {
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
}

// A process-wide cap on the linear kernels' ISA (set_linear_isa_cap; kAuto: none), so tests can
// run a whole model on each path of one machine.
inline std::atomic<int64_t>& linear_isa_cap() {
  static std::atomic<int64_t> cap{(int64_t)Isa::kAuto};
  return cap;
}

// The best ISA at most `cap` and the process-wide cap (kAuto: no cap) that this CPU has.
inline Isa best_isa(Isa cap = Isa::kAuto) {
  const auto global = (Isa)linear_isa_cap().load(std::memory_order_relaxed);
  if (cap == Isa::kAuto || (global != Isa::kAuto && global < cap)) cap = global;
  if ((cap == Isa::kAuto || cap == Isa::kAvx512) && cpu_has_avx512()) return Isa::kAvx512;
  if (cap != Isa::kScalar && cpu_has_avx2()) return Isa::kAvx2;
  return Isa::kScalar;
}

struct QintJob {
  int64_t format;
  const uint8_t* packed;  // tiles of tile_pack.h, tile_bytes(format, K) apart
  Acts x;                 // the quantized rows
  float* out;             // [M, N], rows out_stride apart
  int64_t out_stride;
  const float* bias;  // [N] or nullptr
  int64_t N;          // columns (the last tile may be partial)

  // Rows r0 .. r0 + rows - 1 of one tile's results into the output (+ bias).
  void store(const float (*res)[16], int64_t r0, int64_t rows, int64_t tile) const {
    const int64_t n0 = tile * kTileCols, cols = N - n0 < kTileCols ? N - n0 : kTileCols;
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = out + (r0 + r) * out_stride + n0;
      for (int64_t c = 0; c < cols; ++c) dst[c] = bias ? res[r][c] + bias[n0 + c] : res[r][c];
    }
  }
};

void qint_tiles_avx512(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1);
void qint_tiles_avx2(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1);
void qint_tiles_scalar(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1);

// Rows per pass over the tiles: their activations stay in L2 while the tiles stream.
constexpr int64_t kQintRowBlock = 64;

// out[M, N] = x @ W^T (+ bias) with `acts` the quantized rows of x. `isa` must be one this CPU
// has (best_isa).
inline void run_qint(const QintJob& job, Isa isa) {
  auto* tiles = isa == Isa::kAvx512 ? qint_tiles_avx512
                : isa == Isa::kAvx2 ? qint_tiles_avx2
                                    : qint_tiles_scalar;
  const int64_t num_tiles = (job.N + kTileCols - 1) / kTileCols;
  for (int64_t r0 = 0; r0 < job.x.M; r0 += kQintRowBlock) {
    const int64_t r1 = job.x.M - r0 < kQintRowBlock ? job.x.M : r0 + kQintRowBlock;
    at::parallel_for(0, num_tiles, 1,
                     [&](int64_t begin, int64_t end) { tiles(job, begin, end, r0, r1); });
  }
}

}  // namespace goodspeed
