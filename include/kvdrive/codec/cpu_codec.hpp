// Coding and decoding one page on the CPU (codec/page_codec.hpp gives the layout, codec/quantize.hpp
// the arithmetic). A page is the K block [tokens][head_dim] followed by the V block, in the KV
// dtype (float, half or bfloat16); its coded form is CodedLayout::bytes bytes.
//
//   encode_page(layout, page, coded)    page -> coded bytes
//   decode_page(layout, coded, page)    coded bytes -> page: AVX2 + F16C + FMA where the compiler
//                                       targets them, else decode_page_portable; both give the same
//                                       bits (one fmaf per value, conversions rounding to nearest even)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvdrive/codec/page_codec.hpp"
#include "kvdrive/codec/quantize.hpp"
#include "kvdrive/core/half.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(KVD_DISABLE_SIMD)
#define KVD_CODEC_AVX2 1
#include <immintrin.h>
#endif

namespace kvdrive::codec {

namespace detail {

/// The header's four floats.
struct PageRanges {
  BlockRange keys, values;
};

inline PageRanges load_ranges(const std::uint8_t* coded) {
  float f[4];
  std::memcpy(f, coded, sizeof f);
  return {{f[0], f[1]}, {f[2], f[3]}};
}

inline void store_ranges(std::uint8_t* coded, const PageRanges& r) {
  const float f[4] = {r.keys.lo, r.keys.unit, r.values.lo, r.values.unit};
  std::memcpy(coded, f, sizeof f);
}

/// Quantizes a block whose value (t, c) belongs to group group_of(t, c) of `groups`, writing the
/// groups' codes at `codes` and the values at `data`; returns the block range.
template <class T, class GroupOf>
BlockRange encode_block(const CodedLayout& l, const T* block, std::uint32_t groups, GroupOf group_of, std::uint8_t* codes, std::uint8_t* data) {
  const std::size_t n = std::size_t{l.tokens} * l.head_dim;
  thread_local std::vector<float> values, gmin, gmax, inv_step;
  thread_local std::vector<GroupRange> ranges;
  values.resize(n);
  gmin.assign(groups, kValueCap);
  gmax.assign(groups, -kValueCap);
  ranges.resize(groups);
  inv_step.resize(groups);
  for (std::uint32_t t = 0; t < l.tokens; ++t)
    for (std::uint32_t c = 0; c < l.head_dim; ++c) {
      const std::size_t i = std::size_t{t} * l.head_dim + c;
      const float x = clamp_value(to_float(block[i]));
      values[i] = x;
      const std::uint32_t g = group_of(t, c);
      gmin[g] = std::min(gmin[g], x);
      gmax[g] = std::max(gmax[g], x);
    }
  const float lo = *std::min_element(gmin.begin(), gmin.end()), hi = *std::max_element(gmax.begin(), gmax.end());
  const BlockRange b = block_range(lo, hi);
  for (std::uint32_t g = 0; g < groups; ++g) {
    codes[2 * g] = low_code(b, gmin[g]);
    codes[2 * g + 1] = high_code(b, gmax[g]);
    ranges[g] = group_range(b, codes[2 * g], codes[2 * g + 1], l.inv_levels);
    inv_step[g] = inverse_step(ranges[g]);
  }
  if (l.bits == 8) {
    for (std::uint32_t t = 0; t < l.tokens; ++t)
      for (std::uint32_t c = 0; c < l.head_dim; ++c) {
        const std::size_t i = std::size_t{t} * l.head_dim + c;
        const std::uint32_t g = group_of(t, c);
        data[i] = static_cast<std::uint8_t>(quantize(ranges[g], inv_step[g], values[i], l.levels));
      }
  } else {
    for (std::size_t i = 0; i < n; i += 2) {  // head_dim is even, so a pair never crosses a token
      const auto t = static_cast<std::uint32_t>(i / l.head_dim), c = static_cast<std::uint32_t>(i % l.head_dim);
      const std::uint32_t g0 = group_of(t, c), g1 = group_of(t, c + 1);
      data[i / 2] =
          pack_nibbles(quantize(ranges[g0], inv_step[g0], values[i], l.levels), quantize(ranges[g1], inv_step[g1], values[i + 1], l.levels));
    }
  }
  return b;
}

/// The decoded ranges of `count` groups whose (low, high) codes start at `codes`, as two arrays.
inline void group_ranges(BlockRange b, const std::uint8_t* codes, std::uint32_t count, float inv_levels, float* lo, float* step) {
  std::uint32_t g = 0;
#if KVD_CODEC_AVX2
  // The same operations as group_range, eight groups at a time: one fma, two multiplies.
  const __m128i lows = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i highs = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256 unit = _mm256_set1_ps(b.unit), base = _mm256_set1_ps(b.lo), inv = _mm256_set1_ps(inv_levels);
  for (; g + 8 <= count; g += 8) {
    const __m128i pairs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * g));
    const __m256i low = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(pairs, lows));
    const __m256i high = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(pairs, highs));
    const __m256i width = _mm256_max_epi32(_mm256_sub_epi32(high, low), _mm256_setzero_si256());
    _mm256_storeu_ps(lo + g, _mm256_fmadd_ps(_mm256_cvtepi32_ps(low), unit, base));
    _mm256_storeu_ps(step + g, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(width), unit), inv));
  }
#endif
  for (; g < count; ++g) {
    const GroupRange r = group_range(b, codes[2 * g], codes[2 * g + 1], inv_levels);
    lo[g] = r.lo, step[g] = r.step;
  }
}

/// Each key channel's decoded range (key_lo, key_step: head_dim each) and each token's value
/// range (value_lo, value_step: tokens each).
inline void decode_ranges(const CodedLayout& l, const std::uint8_t* coded, float* key_lo, float* key_step, float* value_lo, float* value_step) {
  const PageRanges r = load_ranges(coded);
  group_ranges(r.keys, coded + l.key_codes, l.head_dim, l.inv_levels, key_lo, key_step);
  group_ranges(r.values, coded + l.value_codes, l.tokens, l.inv_levels, value_lo, value_step);
}

#if KVD_CODEC_AVX2
/// 8 value codes from position i (a multiple of 8 within a row) as floats.
inline __m256 load_codes8(const std::uint8_t* data, std::size_t i, std::uint32_t bits) {
  __m128i bytes;
  if (bits == 8) {
    bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + i));
  } else {
    std::uint32_t word;
    std::memcpy(&word, data + i / 2, 4);
    const __m128i packed = _mm_cvtsi32_si128(static_cast<int>(word));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(packed, mask), high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    bytes = _mm_unpacklo_epi8(low, high);  // low nibble first: value order
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

inline void store8(float* dst, __m256 v) { _mm256_storeu_ps(dst, v); }
inline void store8(half* dst, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store8(bfloat16* dst, __m256 v) {  // round to nearest even, as float_to_bf16_bits (decoded values are finite)
  const __m256i x = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
}
#endif

}  // namespace detail

/// Codes a page (K block then V block, `tokens` x `head_dim` each) into `coded` (layout.bytes).
template <class T>
void encode_page(const CodedLayout& l, const T* page, std::uint8_t* coded) {
  const T* k = page;
  const T* v = page + std::size_t{l.tokens} * l.head_dim;
  detail::PageRanges r;
  r.keys = detail::encode_block(
      l, k, l.head_dim, [](std::uint32_t, std::uint32_t c) { return c; }, coded + l.key_codes, coded + l.key_data);
  r.values = detail::encode_block(
      l, v, l.tokens, [](std::uint32_t t, std::uint32_t) { return t; }, coded + l.value_codes, coded + l.value_data);
  detail::store_ranges(coded, r);
}

/// Decodes a coded page into `page` (K block then V block), one value at a time.
template <class T>
void decode_page_portable(const CodedLayout& l, const std::uint8_t* coded, T* page) {
  const detail::PageRanges r = detail::load_ranges(coded);
  const std::uint8_t* kd = coded + l.key_data;
  const std::uint8_t* vd = coded + l.value_data;
  T* v = page + std::size_t{l.tokens} * l.head_dim;
  GroupRange keys[1024];
  for (std::uint32_t c = 0; c < l.head_dim; ++c)
    keys[c] = group_range(r.keys, coded[l.key_codes + 2 * c], coded[l.key_codes + 2 * c + 1], l.inv_levels);
  for (std::uint32_t t = 0; t < l.tokens; ++t) {
    const GroupRange vr = group_range(r.values, coded[l.value_codes + 2 * t], coded[l.value_codes + 2 * t + 1], l.inv_levels);
    for (std::uint32_t c = 0; c < l.head_dim; ++c) {
      const std::size_t i = std::size_t{t} * l.head_dim + c;
      page[i] = from_float<T>(dequantize(keys[c], load_code(kd, i, l.bits)));
      v[i] = from_float<T>(dequantize(vr, load_code(vd, i, l.bits)));
    }
  }
}

/// Decodes a coded page into `page`: the AVX2 loop where built, else decode_page_portable.
template <class T>
void decode_page(const CodedLayout& l, const std::uint8_t* coded, T* page) {
#if KVD_CODEC_AVX2
  if (l.head_dim % 8 != 0) return decode_page_portable(l, coded, page);
  alignas(32) float key_lo[1024], key_step[1024], value_lo[4096], value_step[4096];
  detail::decode_ranges(l, coded, key_lo, key_step, value_lo, value_step);
  const std::uint8_t* kd = coded + l.key_data;
  const std::uint8_t* vd = coded + l.value_data;
  T* v = page + std::size_t{l.tokens} * l.head_dim;
  for (std::uint32_t t = 0; t < l.tokens; ++t) {
    const std::size_t row = std::size_t{t} * l.head_dim;
    const __m256 vlo = _mm256_set1_ps(value_lo[t]), vstep = _mm256_set1_ps(value_step[t]);
    for (std::uint32_t c = 0; c < l.head_dim; c += 8) {
      const __m256 kq = detail::load_codes8(kd, row + c, l.bits);
      detail::store8(page + row + c, _mm256_fmadd_ps(kq, _mm256_load_ps(key_step + c), _mm256_load_ps(key_lo + c)));
      const __m256 vq = detail::load_codes8(vd, row + c, l.bits);
      detail::store8(v + row + c, _mm256_fmadd_ps(vq, vstep, vlo));
    }
  }
#else
  decode_page_portable(l, coded, page);
#endif
}

}  // namespace kvdrive::codec
