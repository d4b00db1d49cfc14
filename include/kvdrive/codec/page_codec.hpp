// Cold-page codecs: a sealed page's K and V blocks quantized to 8 or 4 bits (docs/codecs.md).
// This header names a codec (`PageCodec`) and lays out its coded page (`CodedLayout`); the
// arithmetic is in codec/quantize.hpp, the CPU loops in codec/cpu_codec.hpp and the GPU decode
// in cuda/page_decode.cuh.
//
// The grouping follows KIVI (asymmetric, keys per channel, values per token), with two-level
// group ranges so that a page of 8 tokens stays small:
//   - keys: one group per channel over the page's tokens, because key magnitudes differ by
//     channel far more than by token (SmolLM2 has channels at 4-16x the median's mean |k| in
//     every layer);
//   - values: one group per token over its channels;
//   - each block (K, V) keeps its float32 minimum and a unit, (max - min) / 255; each group keeps
//     its minimum and maximum as 8-bit codes of that unit (rounded outward), and its b-bit values
//     span the group's decoded range.
// docs/codecs.md gives the measurements behind it (per-channel keys against RoPE-pair and
// per-token groups, and 8-bit codes against float16 group parameters, on real SmolLM2 attention).
//
// A coded page, for T tokens and D channels (head_dim) at b bits, all little-endian:
//   [0, 16)         float32 K minimum, K unit, V minimum, V unit
//   key codes       u8 (low, high) per channel              (2 x D)
//   value codes     u8 (low, high) per token                (2 x T)
//   key data        T x D values, token-major, b bits each  (b = 4: value i in byte i / 2, the
//   value data      T x D values, likewise                   even one in the low nibble)
// SmolLM2's page (8 x 64, f16: 2,048 bytes) is 1,184 bytes in INT8 (0.58x) and 672 in INT4
// (0.33x); with 16-token pages, 2,224 and 1,200 of 4,096 (0.54x, 0.29x).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvdrive/core/error.hpp"

namespace kvdrive::codec {

/// How a page is stored: in the KV dtype as it is, or quantized.
enum class Codec : std::uint8_t { none, int8, int4 };

constexpr std::string_view codec_name(Codec c) {
  switch (c) {
    case Codec::none: return "none";
    case Codec::int8: return "int8";
    case Codec::int4: return "int4";
  }
  return "?";
}

/// Parses "none", "int8" or "int4"; throws kvdrive::Error naming the choices otherwise.
inline Codec parse_codec(std::string_view s) {
  for (Codec c : {Codec::none, Codec::int8, Codec::int4})
    if (s == codec_name(c)) return c;
  fail("unknown page codec '{}': expected none, int8 or int4", s);
}

/// The codec of a page: what Config names for cold pages.
struct PageCodec {
  Codec codec = Codec::none;

  constexpr bool coded() const { return codec != Codec::none; }
  constexpr int bits() const { return codec == Codec::int8 ? 8 : codec == Codec::int4 ? 4 : 0; }
  friend constexpr bool operator==(const PageCodec&, const PageCodec&) = default;
  std::string name() const { return std::string(codec_name(codec)); }
};

/// Where each part of a coded page lies, for one page shape (tokens x head_dim) and codec.
/// Trivially copyable, so kernels take it by value.
struct CodedLayout {
  std::uint32_t tokens = 0, head_dim = 0;
  std::uint32_t bits = 0;                                                    ///< 8 or 4
  std::uint32_t levels = 0;                                                  ///< 2^bits - 1: the largest value code
  float inv_levels = 0;                                                      ///< the float 1 / levels, which every group range multiplies by
  std::size_t key_codes = 0, value_codes = 0, key_data = 0, value_data = 0;  ///< byte offsets
  std::size_t data_bytes = 0;                                                ///< bytes of one block's values: tokens x head_dim x bits / 8
  std::size_t bytes = 0;                                                     ///< the whole coded page

  static constexpr std::size_t kHeaderBytes = 16;

  /// The layout of a coded page; throws kvdrive::Error for a shape or codec it cannot code.
  static CodedLayout make(int tokens, int head_dim, PageCodec c) {
    KVD_EXPECT(c.coded(), "CodedLayout: codec 'none' has no coded layout");
    KVD_EXPECT(tokens >= 1 && tokens <= 4096, "CodedLayout: {} tokens per page, expected 1..4096", tokens);
    KVD_EXPECT(head_dim >= 2 && head_dim <= 1024 && head_dim % 2 == 0, "CodedLayout: head_dim {} must be even, 2..1024", head_dim);
    CodedLayout l;
    l.tokens = static_cast<std::uint32_t>(tokens);
    l.head_dim = static_cast<std::uint32_t>(head_dim);
    l.bits = static_cast<std::uint32_t>(c.bits());
    l.levels = (1u << l.bits) - 1;
    l.inv_levels = 1.0f / static_cast<float>(l.levels);
    l.key_codes = kHeaderBytes;
    l.value_codes = l.key_codes + 2 * std::size_t{l.head_dim};
    l.key_data = l.value_codes + 2 * std::size_t{l.tokens};
    l.data_bytes = std::size_t{l.tokens} * l.head_dim * l.bits / 8;
    l.value_data = l.key_data + l.data_bytes;
    l.bytes = l.value_data + l.data_bytes;
    return l;
  }
};

}  // namespace kvdrive::codec
