// GGUF's block formats, decoded exactly: dequantize_row turns a row of any computable GgmlType
// (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) into floats, value for value as
// the reference (gguf-py's gguf.quants.dequantize, i.e. ggml's dequantize_row_*) computes them.
// quant_dot.hpp computes dot products straight from the blocks; this file is the definition.
//
// The layouts (little-endian; "fp16" is an IEEE binary16 scale):
//   Q4_0  32 values, 18 bytes: fp16 d; u8 qs[16]            x = d * (q - 8)
//   Q4_1  32 values, 20 bytes: fp16 d, m; u8 qs[16]         x = d * q + m
//   Q5_0  32 values, 22 bytes: fp16 d; u32 qh; u8 qs[16]    x = d * (q - 16)
//   Q5_1  32 values, 24 bytes: fp16 d, m; u32 qh; u8 qs[16] x = d * q + m
//   Q8_0  32 values, 34 bytes: fp16 d; i8 qs[32]            x = d * q
//     4-bit q of value j < 16 is the low nibble of qs[j], of value j + 16 its high nibble; Q5's
//     fifth bit of value j is bit j of qh.
//   Q4_K  256 values, 144 bytes: fp16 d, dmin; u8 scales[12]; u8 qs[128]
//   Q5_K  256 values, 176 bytes: fp16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
//     8 sub-blocks of 32, each with a 6-bit scale sc and min m packed in `scales`
//     (scale_min_k4); x = (d * sc) * q - dmin * m. Sub-blocks 2c and 2c+1 take the low and high
//     nibbles of qs[32c .. 32c+32); Q5_K's fifth bit of value l of sub-block s is bit s of qh[l].
//   Q6_K  256 values, 210 bytes: u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d
//     16 groups of 16 values, x = (d * scales[g]) * (q - 32), q 6 bits: in half h (128 values),
//     value 32k + l (k < 4, l < 32) has the low 4 bits from ql[64h + l + 32 (k & 1)], low nibble
//     for k < 2, high for k >= 2, and the top 2 bits from bits 2k, 2k+1 of qh[32h + l].
// Every product the reference forms from fp16 scales and small integers is exact in float (the
// only rounding is the final add, or Q6_K's one product), so the result does not depend on the
// compiler contracting a multiply-add.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/ggml_type.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "kernels/matrix.hpp"

namespace kvdrive::llama {

namespace quant {

inline constexpr int kQK = 32;    ///< values per block of Q4_0 .. Q8_0
inline constexpr int kQKK = 256;  ///< values per block of the K-quants

inline std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float load_f16(const std::byte* p) { return half_bits_to_float(load_u16(p)); }
inline const std::uint8_t* bytes(const std::byte* p) { return reinterpret_cast<const std::uint8_t*>(p); }

/// The 6-bit scales and mins of a Q4_K/Q5_K block (12 packed bytes): sub-blocks 0..3 keep theirs
/// in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); sub-blocks 4..7 take their low 4 bits
/// from the nibbles of bytes 8..11 (scale low, min high) and their top 2 bits from the top 2 bits
/// of bytes 0..3 (scales) and 4..7 (mins).
inline void scale_min_k4(const std::uint8_t* s, std::uint8_t sc[8], std::uint8_t m[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = static_cast<std::uint8_t>((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4));
    m[j + 4] = static_cast<std::uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// ---- one block each --------------------------------------------------------------------------

inline void dequantize_block_q4_0(const std::byte* blk, float* y) {
  const float d = load_f16(blk);
  const std::uint8_t* qs = bytes(blk + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

inline void dequantize_block_q4_1(const std::byte* blk, float* y) {
  const float d = load_f16(blk), m = load_f16(blk + 2);
  const std::uint8_t* qs = bytes(blk + 4);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

inline void dequantize_block_q5_0(const std::byte* blk, float* y) {
  const float d = load_f16(blk);
  const std::uint32_t qh = load_u32(blk + 2);
  const std::uint8_t* qs = bytes(blk + 6);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

inline void dequantize_block_q5_1(const std::byte* blk, float* y) {
  const float d = load_f16(blk), m = load_f16(blk + 2);
  const std::uint32_t qh = load_u32(blk + 4);
  const std::uint8_t* qs = bytes(blk + 8);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

inline void dequantize_block_q8_0(const std::byte* blk, float* y) {
  const float d = load_f16(blk);
  const auto* qs = reinterpret_cast<const std::int8_t*>(blk + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

inline void dequantize_block_q4_k(const std::byte* blk, float* y) {
  const float d = load_f16(blk), dmin = load_f16(blk + 2);
  std::uint8_t sc[8], m[8];
  scale_min_k4(bytes(blk + 4), sc, m);
  const std::uint8_t* qs = bytes(blk + 16);
  for (int c = 0; c < 4; ++c) {  // 64 values: sub-blocks 2c (low nibbles) and 2c+1 (high)
    const float d1 = d * static_cast<float>(sc[2 * c]), m1 = dmin * static_cast<float>(m[2 * c]);
    const float d2 = d * static_cast<float>(sc[2 * c + 1]), m2 = dmin * static_cast<float>(m[2 * c + 1]);
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d1 * static_cast<float>(qs[32 * c + l] & 0x0F) - m1;
      y[64 * c + 32 + l] = d2 * static_cast<float>(qs[32 * c + l] >> 4) - m2;
    }
  }
}

inline void dequantize_block_q5_k(const std::byte* blk, float* y) {
  const float d = load_f16(blk), dmin = load_f16(blk + 2);
  std::uint8_t sc[8], m[8];
  scale_min_k4(bytes(blk + 4), sc, m);
  const std::uint8_t* qh = bytes(blk + 16);
  const std::uint8_t* qs = bytes(blk + 48);
  for (int c = 0; c < 4; ++c) {
    const float d1 = d * static_cast<float>(sc[2 * c]), m1 = dmin * static_cast<float>(m[2 * c]);
    const float d2 = d * static_cast<float>(sc[2 * c + 1]), m2 = dmin * static_cast<float>(m[2 * c + 1]);
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[32 * c + l] & 0x0F) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = d1 * static_cast<float>(lo) - m1;
      y[64 * c + 32 + l] = d2 * static_cast<float>(hi) - m2;
    }
  }
}

/// The 6-bit value of element 32k + l (k < 4, l < 32) of half h of a Q6_K block, 0..63.
inline int q6_k_value(const std::uint8_t* ql, const std::uint8_t* qh, int h, int k, int l) {
  const std::uint8_t low = ql[64 * h + l + 32 * (k & 1)];
  const int nibble = k < 2 ? (low & 0x0F) : (low >> 4);
  return nibble | (((qh[32 * h + l] >> (2 * k)) & 3) << 4);
}

inline void dequantize_block_q6_k(const std::byte* blk, float* y) {
  const std::uint8_t* ql = bytes(blk);
  const std::uint8_t* qh = bytes(blk + 128);
  const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
  const float d = load_f16(blk + 208);
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int e = 128 * h + 32 * k + l;
        const float ds = d * static_cast<float>(sc[e / 16]);
        y[e] = ds * static_cast<float>(q6_k_value(ql, qh, h, k, l) - 32);
      }
}

using BlockDecoder = void (*)(const std::byte*, float*);

/// The block decoder of a quantized type (nullptr for F32/F16/BF16 and non-computable types).
inline BlockDecoder block_decoder(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return dequantize_block_q4_0;
    case GgmlType::Q4_1: return dequantize_block_q4_1;
    case GgmlType::Q5_0: return dequantize_block_q5_0;
    case GgmlType::Q5_1: return dequantize_block_q5_1;
    case GgmlType::Q8_0: return dequantize_block_q8_0;
    case GgmlType::Q4_K: return dequantize_block_q4_k;
    case GgmlType::Q5_K: return dequantize_block_q5_k;
    case GgmlType::Q6_K: return dequantize_block_q6_k;
    default: return nullptr;
  }
}

/// Throws unless the block kernels implement `t`.
inline void expect_computable(GgmlType t) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  KVD_EXPECT(tr.computable,
             "GGML type {} has no CPU kernels here (computable: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
             "Q8_0, Q4_K, Q5_K, Q6_K)",
             ggml_type_name(t));
}

}  // namespace quant

/// dst[0, n) = the values of the first n elements stored at src in type t. n must be a whole number
/// of t's blocks; a type without kernels (see ggml_type.hpp's `computable`) is an error.
inline void dequantize_row(GgmlType t, const std::byte* src, float* dst, std::int64_t n) {
  quant::expect_computable(t);
  const GgmlTypeTraits tr = ggml_type_traits(t);
  KVD_EXPECT(n >= 0 && n % tr.block_elems == 0, "dequantize_row: {} values are not a whole number of {}-value {} blocks", n, tr.block_elems, tr.name);
  switch (t) {
    case GgmlType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = quant::load_f16(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(quant::load_u16(src + 2 * i));
      return;
    default: break;
  }
  const quant::BlockDecoder decode = quant::block_decoder(t);
  for (std::int64_t b = 0; b < n / tr.block_elems; ++b) decode(src + b * tr.block_bytes, dst + b * tr.block_elems);
}

/// out[0, w.cols) = row `row` of w as floats: the token-embedding lookup of a (quantized) table.
inline void embed_row(const Matrix& w, std::int64_t row, float* out) {
  KVD_EXPECT(row >= 0 && row < w.rows, "embedding row {} is outside [0, {})", row, w.rows);
  dequantize_row(w.type, w.row(row), out, w.cols);
}

}  // namespace kvdrive::llama
