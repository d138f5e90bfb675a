// One layer through the integer tile kernels (kernels/cpu/csrc/qint_avx512.cpp, or
// qint_avx2.cpp with --avx2 or on a CPU without AVX-512 VNNI), outside Python: where a
// verify-shaped call's time goes. On AVX-512 it prints the machine's `vpdpbusd zmm` rate (12
// independent chains); then per activation mode and M the best of 30 calls on a K = 1536,
// N = 8960 layer of random tiles (fine for timing: integer work does not depend on the values),
// in ns per four-product dot the layer needs (int16 needs two per four products) and in GB/s
// of weights read. --dram: 32 such layers in one buffer, past the L3, streamed from memory;
// --threads 2: the tiles split in halves; --rows M: that M only. It first prints how fast a
// plain AVX2 loop reads the same buffer (one thread, two): the rate the kernel could reach.
//
//   TORCH=.venv/lib/python3.11/site-packages/torch/include
//   g++ -O3 -std=c++17 -ffp-contract=off -fopenmp -isystem $TORCH \
//       -isystem $TORCH/torch/csrc/api/include -Ikernels/cpu/csrc benchmarks/qint_layer.cpp \
//       kernels/cpu/csrc/qint_avx512.cpp kernels/cpu/csrc/qint_avx2.cpp -o /tmp/qint_layer \
//       -lpthread
//   /tmp/qint_layer 12            # Q4_K (ggml type ids: 8 Q8_0, 6 Q5_0, 14 Q6_K, ...)
//   /tmp/qint_layer 12 --dram --threads 2 [--avx2] [--rows 1]
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "qint.h"

using namespace goodspeed;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double vnni_ns() {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i u = _mm512_set1_epi32(3);
  const __m512i v = _mm512_set1_epi32(5);
  const long n = 50000000;
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], u, v);
    __asm__ volatile("" : "+v"(u));
  }
  const double ns = seconds_since(start) * 1e9 / (n * 12.0);
  __m512i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  if (_mm512_reduce_add_epi32(sum) == 42) std::puts("");  // keeps the chains alive
  return ns;
}

using Tiles = void (*)(const QintJob&, int64_t, int64_t, int64_t, int64_t);

__attribute__((target("avx2"))) void read_bytes(const uint8_t* data, size_t begin, size_t end) {
  __m256i sum = _mm256_setzero_si256();
  for (size_t i = begin; i < end; i += 32) {
    sum = _mm256_add_epi64(sum, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i*)(data + i)),
                                                _mm256_setzero_si256()));
  }
  volatile long long keep = _mm256_extract_epi64(sum, 0);
  (void)keep;
}

// GB/s of a plain read of the buffer, best of 20, on one thread or split in halves over two.
double read_rate(const std::vector<uint8_t>& buffer, bool two) {
  const size_t end = buffer.size() / 64 * 64, half = end / 2 / 64 * 64;
  double best = 1e9;
  for (int rep = 0; rep < 20; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    if (!two) {
      read_bytes(buffer.data(), 0, end);
    } else {
      std::thread other([&] { read_bytes(buffer.data(), 0, half); });
      read_bytes(buffer.data(), half, end);
      other.join();
    }
    best = std::min(best, seconds_since(start));
  }
  return buffer.size() / best / 1e9;
}

void run(Tiles kernel, const QintJob& job, int64_t tiles, int64_t M, bool two) {
  if (!two) return kernel(job, 0, tiles, 0, M);
  std::thread half([&] { kernel(job, 0, tiles / 2, 0, M); });
  kernel(job, tiles / 2, tiles, 0, M);
  half.join();
}

}  // namespace

int main(int argc, char** argv) {
  if (!cpu_has_avx2()) {
    std::puts("this CPU lacks AVX2");
    return 1;
  }
  const int64_t format = argc > 1 ? std::atol(argv[1]) : kQ4_K;
  bool dram = false, two = false, avx2 = !cpu_has_avx512();
  int64_t only_rows = 0;
  for (int i = 2; i < argc; ++i) {
    dram |= std::strcmp(argv[i], "--dram") == 0;
    avx2 |= std::strcmp(argv[i], "--avx2") == 0;
    two |= std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) == 2;
    if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) only_rows = std::atol(argv[i + 1]);
  }
  const Tiles kernel = avx2 ? qint_tiles_avx2 : qint_tiles_avx512;
  std::printf("kernel: %s\n", avx2 ? "AVX2" : "AVX-512 VNNI");
  if (!avx2) std::printf("vpdpbusd zmm: %.3f ns each (12 independent chains, one thread)\n", vnni_ns());
  const int64_t K = 1536, N = 8960 * (dram ? 32 : 1), tiles = N / kTileCols;
  std::vector<uint8_t> packed(tile_bytes(format, K) * tiles);
  std::srand(0);
  for (auto& byte : packed) byte = (uint8_t)((std::rand() & 0x3f) | 0x40);  // no NaN scales
  std::printf("plain read: %.1f GB/s one thread, %.1f GB/s two\n", read_rate(packed, false),
              read_rate(packed, true));
  for (ActMode mode : {ActMode::kInt8, ActMode::kInt16}) {
    for (int64_t M : {1, 2, 3, 4, 5, 8}) {
      if (only_rows > 0 && M != only_rows) continue;
      std::vector<float> x(M * K);
      for (auto& value : x) value = (std::rand() % 2000 - 1000) / 1000.0f;
      const QuantizedActs acts(x.data(), K, M, K, mode);
      std::vector<float> out(M * N);
      const QintJob job{format, packed.data(), acts.view(), out.data(), N, nullptr, N};
      double best = 1e9;
      for (int rep = 0; rep < 30; ++rep) {
        const auto start = std::chrono::steady_clock::now();
        run(kernel, job, tiles, M, two);
        best = std::min(best, seconds_since(start));
      }
      const double dots = (double)M * K * N / 64 * (mode == ActMode::kInt16 ? 2 : 1);
      std::printf("type %ld %s M=%ld: %.3f ms, %.3f ns per dot, %.3f ms per row, %.1f GB/s\n",
                  (long)format, mode == ActMode::kInt16 ? "int16" : "int8", (long)M, best * 1e3,
                  best * 1e9 / dots, best * 1e3 / M, packed.size() / best / 1e9);
    }
  }
  return 0;
}
