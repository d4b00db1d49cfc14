// The activations of quant_dot.hpp's kernels: float rows quantized per block with a float scale
// (Q16x32: 32 int16 for the 32-value formats; Q8x256: 256 int8 with the sums of 16 for the
// K-quants), in the layout the tiles read (ActRow). quant_dot.hpp says how each weight format
// meets them, and why the 32-value formats take 16 bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>  // std::exchange, for thread_pool.hpp
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kernels/quant.hpp"

namespace kvdrive::llama::quant {

enum class ActFormat : int { Float, Q16x32, Q8x256 };

/// The activation format a weight type computes with.
constexpr ActFormat act_format(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0: return ActFormat::Q16x32;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return ActFormat::Q8x256;
    default: return ActFormat::Float;
  }
}

constexpr int act_block(ActFormat f) { return f == ActFormat::Q8x256 ? kQKK : kQK; }

/// One quantized activation row, as the kernels read it.
struct ActRow {
  const std::int16_t* q16 = nullptr;  ///< Q16x32: the row's values
  const std::int8_t* q = nullptr;     ///< Q8x256: the row's values
  /// Q16x32: 2 per block, the scale d and d * (the sum of the block's q), side by side for one
  /// load; Q8x256: the scale of each block.
  const float* d = nullptr;
  const std::int16_t* sums16 = nullptr;  ///< Q8x256: 16 per block, the sums of q[16g .. 16g+16)
  int d_stride = 1;                      ///< 2 (Q16x32) or 1 (Q8x256)

  float scale(std::int64_t b) const { return d[b * d_stride]; }
};

/// round(v) to nearest even as an int32, the conversion of AVX2's cvtps_epi32 (NaN and values
/// beyond int32 give INT32_MIN), then saturated to [lo, hi] as its packs do.
inline int round_saturate(float v, int lo, int hi) {
  const float r = std::nearbyint(v);
  if (!(r >= -2147483648.0f && r < 2147483648.0f)) return lo;
  return static_cast<int>(std::clamp(r, static_cast<float>(lo), static_cast<float>(hi)));
}

/// The largest |x[j]| of `len` values (a multiple of 8).
inline float abs_max(const float* x, int len) {
#if KVD_CPU_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int j = 0; j < len; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  return _mm_cvtss_f32(m4);
#else
  float amax = 0.0f;
  for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
#endif
}

/// Quantizes `len` values (a multiple of 32) to int8 with one scale d = max|x| / 127; returns d.
inline float quantize_block_q8(const float* x, int len, std::int8_t* q) {
  const float d = abs_max(x, len) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
#if KVD_CPU_AVX2
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int j = 0; j < len; j += 32) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), vid));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), vid));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), vid));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), vid));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm256_permutevar8x32_epi32(p, order));
  }
#else
  for (int j = 0; j < len; ++j) q[j] = static_cast<std::int8_t>(round_saturate(x[j] * id, -128, 127));
#endif
  return d;
}

/// Quantizes 32 values to int16 with one scale d = max|x| / 32767; returns d.
inline float quantize_block_q16(const float* x, std::int16_t* q) {
  const float d = abs_max(x, kQK) / 32767.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
#if KVD_CPU_AVX2
  const __m256 vid = _mm256_set1_ps(id);
  for (int j = 0; j < kQK; j += 16) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), vid));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), vid));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
  }
#else
  for (int j = 0; j < kQK; ++j) q[j] = static_cast<std::int16_t>(round_saturate(x[j] * id, -32768, 32767));
#endif
  return d;
}

/// n activation rows of `cols` values quantized in `format`'s blocks. Reused across calls: its
/// buffers only grow.
class QuantizedActs {
 public:
  /// Quantizes x[n][cols]; rows are shared out on `pool` when given (each row's result is the same).
  void quantize(ActFormat format, const float* x, std::size_t n, std::int64_t cols, ThreadPool* pool = nullptr) {
    KVD_EXPECT(format != ActFormat::Float, "QuantizedActs: Float is not a quantized activation format");
    const int blk = act_block(format);
    KVD_EXPECT(cols > 0 && cols % blk == 0, "activation rows of {} values are not a whole number of {}-value blocks", cols, blk);
    format_ = format;
    n_ = n;
    cols_ = cols;
    nb_ = cols / blk;
    const std::size_t blocks = n * static_cast<std::size_t>(nb_);
    if (format == ActFormat::Q16x32) {
      grow(q16_, n * static_cast<std::size_t>(cols));
      grow(d_, 2 * blocks);
    } else {
      grow(q_, n * static_cast<std::size_t>(cols));
      grow(d_, blocks);
      grow(sums16_, blocks * 16);
    }
    auto one = [&](std::size_t i) { quantize_row(x + i * static_cast<std::size_t>(cols), i); };
    if (pool != nullptr && n >= 4) {
      pool->parallel_for(n, one);
    } else {
      for (std::size_t i = 0; i < n; ++i) one(i);
    }
  }

  ActFormat format() const { return format_; }
  std::size_t rows() const { return n_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t blocks_per_row() const { return nb_; }

  ActRow row(std::size_t i) const {
    ActRow r;
    const std::size_t first = i * static_cast<std::size_t>(cols_);
    r.d_stride = format_ == ActFormat::Q16x32 ? 2 : 1;
    r.d = d_.data() + i * static_cast<std::size_t>(nb_) * static_cast<std::size_t>(r.d_stride);
    if (format_ == ActFormat::Q16x32) {
      r.q16 = q16_.data() + first;
    } else {
      r.q = q_.data() + first;
      r.sums16 = sums16_.data() + i * static_cast<std::size_t>(nb_) * 16;
    }
    return r;
  }

  /// out[cols] = row i as the kernels see it: d * q per block.
  void dequantize(std::size_t i, float* out) const {
    const ActRow r = row(i);
    const int blk = act_block(format_);
    for (std::int64_t j = 0; j < cols_; ++j) out[j] = r.scale(j / blk) * static_cast<float>(r.q16 != nullptr ? r.q16[j] : r.q[j]);
  }

 private:
  template <class T>
  static void grow(std::vector<T>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }

  void quantize_row(const float* x, std::size_t i) {
    if (format_ == ActFormat::Q16x32) return quantize_row_q16(x, i);
    std::int8_t* q = q_.data() + i * static_cast<std::size_t>(cols_);
    float* d = d_.data() + i * static_cast<std::size_t>(nb_);
    for (std::int64_t b = 0; b < nb_; ++b) {
      std::int8_t* qb = q + b * kQKK;
      d[b] = quantize_block_q8(x + b * kQKK, kQKK, qb);
      std::int16_t* s16 = sums16_.data() + (i * static_cast<std::size_t>(nb_) + static_cast<std::size_t>(b)) * 16;
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int k = 0; k < 16; ++k) sum += qb[16 * g + k];
        s16[g] = static_cast<std::int16_t>(sum);
      }
    }
  }

  void quantize_row_q16(const float* x, std::size_t i) {
    std::int16_t* q = q16_.data() + i * static_cast<std::size_t>(cols_);
    float* d = d_.data() + i * static_cast<std::size_t>(nb_) * 2;
    for (std::int64_t b = 0; b < nb_; ++b) {
      std::int16_t* qb = q + b * kQK;
      const float scale = quantize_block_q16(x + b * kQK, qb);
      int sum = 0;
      for (int k = 0; k < kQK; ++k) sum += qb[k];
      d[2 * b] = scale;
      d[2 * b + 1] = scale * static_cast<float>(sum);
    }
  }

  ActFormat format_ = ActFormat::Q16x32;
  std::size_t n_ = 0;
  std::int64_t cols_ = 0, nb_ = 0;
  std::vector<std::int16_t> q16_;  ///< Q16x32
  std::vector<std::int8_t> q_;     ///< Q8x256
  std::vector<float> d_;
  std::vector<std::int16_t> sums16_;
};

}  // namespace kvdrive::llama::quant
