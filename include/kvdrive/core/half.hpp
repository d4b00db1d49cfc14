// Host-side 16-bit float types: kvdrive::half (IEEE binary16) and kvdrive::bfloat16.
// Conversions round to nearest even, keep NaN a (quiet) NaN, overflow to infinity and handle
// subnormals. The bit-level functions are KVD_HOST_DEVICE so kernels share them; the classes are
// thin, trivially copyable wrappers over the bits with the same layout as CUDA's __half and
// __nv_bfloat16.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive {

KVD_HOST_DEVICE std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

KVD_HOST_DEVICE float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// float -> binary16 bits, round to nearest even.
KVD_HOST_DEVICE std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf or NaN; a NaN keeps its top payload bits and stays quiet
    const std::uint32_t nan = ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u;
    return static_cast<std::uint16_t>(sign | 0x7c00u | nan);
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (ax < 0x38800000u) {                                                    // below the smallest normal half (2^-14): subnormal or zero
    if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);          // <= 2^-25 ties to 0
    const std::uint32_t exponent = ax >> 23;
    const std::uint32_t mantissa = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // value / 2^-24 = mantissa >> shift
    std::uint32_t r = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (r & 1u))) ++r;  // may carry into the normals
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = (ax >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  const std::uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // a carry may round up to Inf
  return static_cast<std::uint16_t>(sign | r);
}

/// binary16 bits -> float (exact).
KVD_HOST_DEVICE float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
KVD_HOST_DEVICE std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

KVD_HOST_DEVICE float bf16_bits_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

/// IEEE binary16 storage type.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  KVD_HOST_DEVICE explicit half(float f) : bits(float_to_half_bits(f)) {}
  KVD_HOST_DEVICE explicit operator float() const { return half_bits_to_float(bits); }
  KVD_HOST_DEVICE static half from_bits(std::uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 storage type (the top 16 bits of a float).
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  KVD_HOST_DEVICE explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  KVD_HOST_DEVICE explicit operator float() const { return bf16_bits_to_float(bits); }
  KVD_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

/// Converts any KV element type to float (the accumulation type).
KVD_HOST_DEVICE float to_float(float x) { return x; }
KVD_HOST_DEVICE float to_float(half x) { return half_bits_to_float(x.bits); }
KVD_HOST_DEVICE float to_float(bfloat16 x) { return bf16_bits_to_float(x.bits); }

/// Converts float to a KV element type, rounding to nearest even.
template <class T>
KVD_HOST_DEVICE T from_float(float x) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return x;
  } else {
    return T(x);
  }
}

}  // namespace kvdrive
