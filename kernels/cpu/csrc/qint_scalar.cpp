// The integer-activation tile kernels (qint_kernel.h) in portable C++: the reference the SIMD
// paths must equal bit for bit, and the path of CPUs without AVX2. Byte shifts stand for the
// SIMD 16-bit shifts: every use masks to bits that stay within their byte, where both agree.
#include <cmath>

#include "qint.h"

namespace goodspeed {
namespace qint_scalar {

struct V {
  // One row per pass: this path is the reference and the fallback of old CPUs; more row
  // variants only lengthen the build (each is a full instantiation of every format).
  static constexpr int kLanes = 16, kMaxRows = 1;
  static int stream_rows() { return 1; }
  static constexpr int64_t stream_ahead_bytes(int64_t) { return 0; }
  struct U8 { uint8_t b[64]; };
  struct I32 { int32_t v[16]; };
  struct F32 { float v[16]; };

  static U8 load(const uint8_t* p) { U8 u; std::memcpy(u.b, p, 64); return u; }
  static U8 low4(U8 v) { for (auto& b : v.b) b &= 0x0F; return v; }
  static U8 high4(U8 v) { for (auto& b : v.b) b = (uint8_t)(b >> 4); return v; }
  static U8 shift_mask(U8 v, int n, uint8_t mask) {
    for (auto& b : v.b) b = (uint8_t)((n >= 0 ? (unsigned)b << n : (unsigned)b >> -n) & mask);
    return v;
  }
  static U8 or8(U8 a, const U8& b) { for (int i = 0; i < 64; ++i) a.b[i] |= b.b[i]; return a; }
  static I32 zero() { return I32{}; }
  template <bool kFull>
  static I32 dot(I32 acc, const U8& u, int32_t x4) {
    for (int l = 0; l < 16; ++l) {
      for (int t = 0; t < 4; ++t) acc.v[l] += (int32_t)u.b[4 * l + t] * (int8_t)(x4 >> (8 * t));
    }
    return acc;
  }
  static constexpr int partial_depth(int) { return 0; }  // products go straight into int32
  static I32 combine(I32 hi, const I32& lo) {
    for (int l = 0; l < 16; ++l) hi.v[l] = (int32_t)((uint32_t)hi.v[l] << 8) + lo.v[l];
    return hi;
  }
  static I32 add(I32 a, const I32& b) { for (int l = 0; l < 16; ++l) a.v[l] += b.v[l]; return a; }
  static I32 sub_scalar(I32 a, int32_t s) { for (auto& v : a.v) v -= s; return a; }
  static F32 cvt(const I32& a) { F32 f; for (int l = 0; l < 16; ++l) f.v[l] = (float)a.v[l]; return f; }
  static F32 zero_f() { return F32{}; }
  static F32 fma(const F32& a, const F32& b, F32 c) {
    for (int l = 0; l < 16; ++l) c.v[l] = std::fmaf(a.v[l], b.v[l], c.v[l]);
    return c;
  }
  static F32 fnma(const F32& a, const F32& b, F32 c) {
    for (int l = 0; l < 16; ++l) c.v[l] = std::fmaf(-a.v[l], b.v[l], c.v[l]);
    return c;
  }
  static F32 mul(F32 a, const F32& b) { for (int l = 0; l < 16; ++l) a.v[l] *= b.v[l]; return a; }
  static F32 set1(float v) { F32 f; for (auto& x : f.v) x = v; return f; }
  static F32 halves(const uint8_t* p) {
    F32 f;
    for (int l = 0; l < 16; ++l) f.v[l] = half_to_float(load_u16(p + 2 * l));
    return f;
  }
  static F32 bytes_u8(const uint8_t* p) { F32 f; for (int l = 0; l < 16; ++l) f.v[l] = p[l]; return f; }
  static F32 bytes_i8(const uint8_t* p) {
    F32 f;
    for (int l = 0; l < 16; ++l) f.v[l] = (float)(int8_t)p[l];
    return f;
  }
  static void store(float* out, const F32& v) { std::memcpy(out, v.v, sizeof(v.v)); }
};

}  // namespace qint_scalar
}  // namespace goodspeed

#define QINT_NS qint_scalar
#include "qint_kernel.h"
#undef QINT_NS

namespace goodspeed {
void qint_tiles_scalar(const QintJob& job, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  qint_scalar::run(job, t0, t1, r0, r1);
}
}  // namespace goodspeed
