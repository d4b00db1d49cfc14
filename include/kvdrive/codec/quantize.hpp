// The arithmetic of coded pages (codec/page_codec.hpp), one value at a time: block and group
// ranges, quantizing and dequantizing a value, nibble packing. Every function is
// KVD_HOST_DEVICE: the CPU loops (codec/cpu_codec.hpp) and the GPU decode kernel
// (cuda/page_decode.cuh) call these, so a decoded value is the same float on both: dequantize is
// one fused multiply-add (fmaf on both sides, never left to the compiler's contraction) and
// quantize rounds to nearest even (rintf).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive::codec {

/// A block's (one page's K or V) range: its minimum and the unit of its group codes.
struct BlockRange {
  float lo = 0, unit = 0;  ///< unit = (max - min) / 255
};

/// A group's decoded range: value code q stands for lo + q x step.
struct GroupRange {
  float lo = 0, step = 0;
};

/// Values are clamped to +-2^64, and NaN is read as 0, before coding, so every range is finite.
/// A model's K and V never come near it; the clamp keeps a broken page from breaking the codec.
inline constexpr float kValueCap = 18446744073709551616.0f;

KVD_HOST_DEVICE float clamp_value(float x) {
  if (!(x == x)) return 0.0f;
  return x > kValueCap ? kValueCap : (x < -kValueCap ? -kValueCap : x);
}

/// The block range of values in [lo, hi].
KVD_HOST_DEVICE BlockRange block_range(float lo, float hi) { return {lo, (hi - lo) / 255.0f}; }

/// A group's minimum as a code, rounded down (so the decoded range covers it).
KVD_HOST_DEVICE std::uint8_t low_code(BlockRange b, float group_min) {
  if (!(b.unit > 0.0f)) return 0;
  const float r = floorf((group_min - b.lo) / b.unit);
  return r <= 0.0f ? std::uint8_t{0} : r >= 255.0f ? std::uint8_t{255} : static_cast<std::uint8_t>(r);
}

/// A group's maximum as a code, rounded up.
KVD_HOST_DEVICE std::uint8_t high_code(BlockRange b, float group_max) {
  if (!(b.unit > 0.0f)) return 0;
  const float r = ceilf((group_max - b.lo) / b.unit);
  return r <= 0.0f ? std::uint8_t{0} : r >= 255.0f ? std::uint8_t{255} : static_cast<std::uint8_t>(r);
}

/// The decoded range of a group with codes (low, high), for value codes 0..levels
/// (inv_levels = CodedLayout::inv_levels, the float 1 / levels: a multiply, not a divide).
KVD_HOST_DEVICE GroupRange group_range(BlockRange b, std::uint8_t low, std::uint8_t high, float inv_levels) {
  GroupRange g;
  g.lo = fmaf(static_cast<float>(low), b.unit, b.lo);
  const float span = static_cast<float>(high > low ? high - low : 0) * b.unit;
  g.step = span * inv_levels;
  return g;
}

/// 1 / step, or 0 for a group of one value (encoding only).
KVD_HOST_DEVICE float inverse_step(GroupRange g) { return g.step > 0.0f ? 1.0f / g.step : 0.0f; }

/// The value code of x: the nearest level (ties to even), clamped to 0..levels.
KVD_HOST_DEVICE std::uint32_t quantize(GroupRange g, float inv_step, float x, std::uint32_t levels) {
  const float r = (x - g.lo) * inv_step;
  if (!(r > 0.0f)) return 0;  // below the range, or NaN
  if (r >= static_cast<float>(levels)) return levels;
  return static_cast<std::uint32_t>(rintf(r));
}

/// The value a code stands for.
KVD_HOST_DEVICE float dequantize(GroupRange g, std::uint32_t q) { return fmaf(static_cast<float>(q), g.step, g.lo); }

/// Value code i of a block of `bits`-bit codes.
KVD_HOST_DEVICE std::uint32_t load_code(const std::uint8_t* data, std::size_t i, std::uint32_t bits) {
  if (bits == 8) return data[i];
  return (data[i >> 1] >> ((i & 1) * 4)) & 0xFu;
}

/// Packs two 4-bit codes into a byte: the even value in the low nibble.
KVD_HOST_DEVICE std::uint8_t pack_nibbles(std::uint32_t even, std::uint32_t odd) {
  return static_cast<std::uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4));
}

}  // namespace kvdrive::codec
