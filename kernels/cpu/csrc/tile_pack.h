// Weights repacked once at load into tiles of 16 output columns, the layout every tile kernel
// reads (qint_kernel.h for integer activations, float_avx512.h for float32 ones). Packing only
// moves bytes (and unpacks the K-quants' 6-bit scales into bytes): the values are the GGUF's.
//
// A tile holds 16 columns (weight rows) c; it is a run of blocks along the input dimension
// (32 inputs for Q8_0, Q4_x and Q5_x, a 256-input super-block for the K-quants). A "plane" is 64
// bytes: 4 bytes per column, column c at bytes 4c .. 4c + 3, so one 32-bit lane is one column.
// Per block, in order (fp16 scales 2 bytes a column, per-column bytes 1 a column):
//   Q8_0  d | 8 planes: plane p byte 4c + t = q[c][4p + t] ^ 0x80 (q + 128 as a byte)
//   Q4_0  d | 4 planes: plane v byte 4c + t = qs[c][4v + t] (low nibble: input 4v + t, high
//         nibble: input 16 + 4v + t)
//   Q4_1  d | m | 4 planes as Q4_0
//   Q5_0  d | 4 planes as Q4_0 | fifth plane: byte 4c + t bit v = fifth bit of input 4v + t,
//         bit 4 + v = fifth bit of input 16 + 4v + t (v = 0..3)
//   Q5_1  d | m | 4 planes | fifth plane
//   Q4_K  d | dmin | sc[8][16] | mn[8][16] (sub-block s of column c at byte 16s + c) |
//         per pair j = 0..3 of sub-blocks: 8 planes, plane v byte 4c + t = qs[c][32j + 4v + t]
//         (low nibble: sub-block 2j input 4v + t, high nibble: sub-block 2j + 1, same input)
//   Q5_K  as Q4_K, and after each pair's 8 planes 2 fifth planes: plane k byte 4c + t bit
//         v - 4k = bit 2j of qh[c][4v + t] (sub-block 2j), bit 4 + v - 4k = bit 2j + 1 (v in
//         4k .. 4k + 3)
//   Q6_K  d | sc[16][16] int8 (scale s of column c at byte 16s + c) | per group g = 0..7 of 32
//         inputs: 4 nibble planes (byte 4c + t: low nibble = low 4 bits of input 32g + 4v + t,
//         high nibble = of input 32g + 16 + 4v + t) | 2 top planes (plane h byte 4c + t bits
//         2v, 2v + 1 = top 2 bits of input 32g + 16h + 4v + t, v = 0..3)
// Every format's block is exactly 16 GGUF blocks' bytes, but Q4_K and Q5_K (their 12 bytes of
// packed 6-bit scales become 16 bytes: +2.8% and +2.3%).
#pragma once

#include <cstdint>
#include <cstring>

#include "common.h"

namespace goodspeed {

constexpr int64_t kTileCols = 16;

inline bool tile_format(int64_t format) { return block_shape(format).elems > 0; }

// Bytes of one tile block (16 columns x one GGUF block's inputs).
inline int64_t tile_block_bytes(int64_t format) {
  switch (format) {
    case kQ4_K: return 64 + 256 + 4 * 512;
    case kQ5_K: return 64 + 256 + 4 * (512 + 128);
    default: return kTileCols * block_shape(format).bytes;
  }
}

// Bytes of a tile of K inputs.
inline int64_t tile_bytes(int64_t format, int64_t K) {
  return K / block_shape(format).elems * tile_block_bytes(format);
}

namespace pack_detail {

inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Copies the fp16 at byte `at` of each column's block into 16 consecutive halves.
inline void halves(const uint8_t* const blocks[16], int64_t at, uint8_t* dst) {
  for (int c = 0; c < 16; ++c) std::memcpy(dst + 2 * c, blocks[c] + at, 2);
}

// Byte planes: plane v byte 4c + t = bytes[c][4v + t] ^ flip for v < num_planes (a column's
// 4 bytes of a plane are 4 consecutive bytes of its block: moved as one 32-bit word).
inline void byte_planes(const uint8_t* const bytes[16], int64_t num_planes, uint8_t* dst,
                        uint8_t flip = 0) {
  const uint32_t flip4 = 0x01010101u * flip;
  for (int64_t v = 0; v < num_planes; ++v) {
    for (int c = 0; c < 16; ++c) store_u32(dst + 64 * v + 4 * c, load_u32(bytes[c] + 4 * v) ^ flip4);
  }
}

// Fifth-bit plane of the 32-input formats from each column's 32-bit qh.
inline void fifth_plane(const uint8_t* const blocks[16], int64_t qh_at, uint8_t* dst) {
  for (int c = 0; c < 16; ++c) {
    const uint32_t qh = load_u32(blocks[c] + qh_at);
    for (int t = 0; t < 4; ++t) {
      uint8_t byte = 0;
      for (int v = 0; v < 4; ++v) {
        byte |= (uint8_t)(((qh >> (4 * v + t)) & 1u) << v);
        byte |= (uint8_t)(((qh >> (16 + 4 * v + t)) & 1u) << (4 + v));
      }
      dst[4 * c + t] = byte;
    }
  }
}

inline void pack_small(const uint8_t* const b[16], int64_t format, uint8_t* dst) {
  halves(b, 0, dst);  // d
  const uint8_t* q[16];
  switch (format) {
    case kQ8_0:
      for (int c = 0; c < 16; ++c) q[c] = b[c] + 2;
      return byte_planes(q, 8, dst + 32, 0x80);
    case kQ4_0:
      for (int c = 0; c < 16; ++c) q[c] = b[c] + 2;
      return byte_planes(q, 4, dst + 32);
    case kQ4_1:
      halves(b, 2, dst + 32);  // m
      for (int c = 0; c < 16; ++c) q[c] = b[c] + 4;
      return byte_planes(q, 4, dst + 64);
    case kQ5_0:
      for (int c = 0; c < 16; ++c) q[c] = b[c] + 6;
      byte_planes(q, 4, dst + 32);
      return fifth_plane(b, 2, dst + 32 + 256);
    case kQ5_1:
      halves(b, 2, dst + 32);
      for (int c = 0; c < 16; ++c) q[c] = b[c] + 8;
      byte_planes(q, 4, dst + 64);
      return fifth_plane(b, 4, dst + 64 + 256);
  }
}

// Q4_K / Q5_K: d, dmin, unpacked scales and mins, then per pair of sub-blocks its planes.
inline void pack_k45(const uint8_t* const b[16], bool five, uint8_t* dst) {
  halves(b, 0, dst);
  halves(b, 2, dst + 32);
  for (int c = 0; c < 16; ++c) {
    for (int s = 0; s < 8; ++s) {
      int sc, mn;
      k4_scale(b[c] + 4, s, &sc, &mn);
      dst[64 + 16 * s + c] = (uint8_t)sc;
      dst[192 + 16 * s + c] = (uint8_t)mn;
    }
  }
  uint8_t* out = dst + 320;
  for (int j = 0; j < 4; ++j) {
    const uint8_t* q[16];
    for (int c = 0; c < 16; ++c) q[c] = b[c] + (five ? 48 : 16) + 32 * j;
    byte_planes(q, 8, out);
    out += 512;
    if (!five) continue;
    for (int k = 0; k < 2; ++k, out += 64) {
      for (int c = 0; c < 16; ++c) {
        const uint8_t* qh = b[c] + 16;
        for (int t = 0; t < 4; ++t) {
          uint8_t byte = 0;
          for (int v = 4 * k; v < 4 * k + 4; ++v) {
            byte |= (uint8_t)(((qh[4 * v + t] >> (2 * j)) & 1) << (v - 4 * k));
            byte |= (uint8_t)(((qh[4 * v + t] >> (2 * j + 1)) & 1) << (4 + v - 4 * k));
          }
          out[4 * c + t] = byte;
        }
      }
    }
  }
}

// Q6_K: inputs 32g .. 32g + 31 (packing group g) are gguf's half h = g / 4, quarter q = g % 4:
// input 32g + l keeps its low 4 bits in nibble q / 2 of ql[64h + 32(q % 2) + l] and its top 2
// bits in bits 2q, 2q + 1 of qh[32h + l] (qh = byte 128 of the block), as gguf reads them.
inline void pack_q6k(const uint8_t* const b[16], uint8_t* dst) {
  halves(b, 208, dst);
  for (int c = 0; c < 16; ++c) {
    for (int s = 0; s < 16; ++s) dst[32 + 16 * s + c] = b[c][192 + s];
  }
  uint8_t* out = dst + 288;
  for (int g = 0; g < 8; ++g, out += 384) {
    const int h = g / 4, q = g % 4, low_shift = q < 2 ? 0 : 4, top_shift = 2 * q;
    for (int c = 0; c < 16; ++c) {
      const uint8_t* ql = b[c] + 64 * h + 32 * (q % 2);
      const uint8_t* qh = b[c] + 128 + 32 * h;
      uint32_t top_lo = 0, top_hi = 0;
      for (int v = 0; v < 4; ++v) {  // 4 inputs at once, one per byte of a 32-bit word
        const uint32_t lo = (load_u32(ql + 4 * v) >> low_shift) & 0x0F0F0F0Fu;
        const uint32_t hi = (load_u32(ql + 16 + 4 * v) >> low_shift) & 0x0F0F0F0Fu;
        store_u32(out + 64 * v + 4 * c, lo | (hi << 4));
        top_lo |= ((load_u32(qh + 4 * v) >> top_shift) & 0x03030303u) << (2 * v);
        top_hi |= ((load_u32(qh + 16 + 4 * v) >> top_shift) & 0x03030303u) << (2 * v);
      }
      store_u32(out + 256 + 4 * c, top_lo);
      store_u32(out + 320 + 4 * c, top_hi);
    }
  }
}

}  // namespace pack_detail

// Packs columns n0 .. n0 + 15 of `blocks` ([N, row_bytes], rows >= N are zero columns: a last,
// partial tile) into one tile of K inputs at `tile` (tile_bytes(format, K) bytes).
inline void pack_tile(const uint8_t* blocks, int64_t row_bytes, int64_t N, int64_t n0,
                      int64_t format, int64_t K, uint8_t* tile) {
  const BlockShape shape = block_shape(format);
  const int64_t block_bytes = tile_block_bytes(format);
  static const uint8_t zeros[256] = {};
  std::memset(tile, 0, (size_t)tile_bytes(format, K));
  for (int64_t i = 0; i < K / shape.elems; ++i) {
    const uint8_t* b[16];
    for (int c = 0; c < 16; ++c) {
      b[c] = n0 + c < N ? blocks + (n0 + c) * row_bytes + i * shape.bytes : zeros;
    }
    uint8_t* dst = tile + i * block_bytes;
    if (format == kQ4_K || format == kQ5_K) {
      pack_detail::pack_k45(b, format == kQ5_K, dst);
    } else if (format == kQ6_K) {
      pack_detail::pack_q6k(b, dst);
    } else {
      pack_detail::pack_small(b, format, dst);
    }
  }
}

}  // namespace goodspeed
