// The activations of quant_dot.hpp's kernels: float rows quantized per block to int8 with a float
// scale (Q8x32 for the 32-value formats, Q8x256 with the sums of 16 for the K-quants), in the
// layout the tiles read (ActRow). quant_dot.hpp says how each weight format meets them.
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

enum class ActFormat : int { Float, Q8x32, Q8x256 };

/// The activation format a weight type computes with.
constexpr ActFormat act_format(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0: return ActFormat::Q8x32;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return ActFormat::Q8x256;
    default: return ActFormat::Float;
  }
}

constexpr int act_block(ActFormat f) { return f == ActFormat::Q8x256 ? kQKK : kQK; }

/// One quantized activation row, as the kernels read it.
struct ActRow {
  const std::int8_t* q = nullptr;  ///< the row's values
  /// Q8x32: 2 per block, the scale d and d * (the sum of the block's q), side by side for one load;
  /// Q8x256: the scale of each block.
  const float* d = nullptr;
  const std::int16_t* sums16 = nullptr;  ///< Q8x256: 16 per block, the sums of q[16g .. 16g+16)
  int d_stride = 1;                      ///< 2 (Q8x32) or 1 (Q8x256)

  float scale(std::int64_t b) const { return d[b * d_stride]; }
};

/// q = x * inv_d rounded to nearest even, as an int8: the conversion AVX2's cvtps_epi32 + the
/// saturating packs perform (NaN and values beyond int32 become -128).
inline std::int8_t round_to_i8(float v) {
  const float r = std::nearbyint(v);
  if (!(r >= -2147483648.0f && r < 2147483648.0f)) return -128;
  return static_cast<std::int8_t>(std::clamp(r, -128.0f, 127.0f));
}

/// Quantizes `len` values (a multiple of 32) with one scale; returns it.
inline float quantize_block_q8(const float* x, int len, std::int8_t* q) {
#if KVD_CPU_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int j = 0; j < len; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
#else
  float amax = 0.0f;
  for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[j]));
#endif
  const float d = amax / 127.0f;
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
  for (int j = 0; j < len; ++j) q[j] = round_to_i8(x[j] * id);
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
    grow(q_, n * static_cast<std::size_t>(cols));
    grow(d_, blocks);
    if (format == ActFormat::Q8x32) grow(d_, 2 * blocks);
    else grow(sums16_, blocks * 16);
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
    r.q = q_.data() + i * static_cast<std::size_t>(cols_);
    r.d_stride = format_ == ActFormat::Q8x32 ? 2 : 1;
    r.d = d_.data() + i * static_cast<std::size_t>(nb_) * static_cast<std::size_t>(r.d_stride);
    if (format_ == ActFormat::Q8x256) r.sums16 = sums16_.data() + i * static_cast<std::size_t>(nb_) * 16;
    return r;
  }

  /// out[cols] = row i as the kernels see it: d * q per block.
  void dequantize(std::size_t i, float* out) const {
    const ActRow r = row(i);
    const int blk = act_block(format_);
    for (std::int64_t j = 0; j < cols_; ++j) out[j] = r.scale(j / blk) * static_cast<float>(r.q[j]);
  }

 private:
  template <class T>
  static void grow(std::vector<T>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }

  void quantize_row(const float* x, std::size_t i) {
    const int blk = act_block(format_);
    const std::size_t stride = format_ == ActFormat::Q8x32 ? 2 : 1;
    std::int8_t* q = q_.data() + i * static_cast<std::size_t>(cols_);
    float* d = d_.data() + i * static_cast<std::size_t>(nb_) * stride;
    for (std::int64_t b = 0; b < nb_; ++b) {
      std::int8_t* qb = q + b * blk;
      const float scale = quantize_block_q8(x + b * blk, blk, qb);
      d[static_cast<std::size_t>(b) * stride] = scale;
      if (format_ == ActFormat::Q8x32) {
        int sum = 0;
        for (int k = 0; k < blk; ++k) sum += qb[k];
        d[2 * b + 1] = scale * static_cast<float>(sum);
      } else {
        std::int16_t* s16 = sums16_.data() + (i * static_cast<std::size_t>(nb_) + static_cast<std::size_t>(b)) * 16;
        for (int g = 0; g < 16; ++g) {
          int sum = 0;
          for (int k = 0; k < 16; ++k) sum += qb[16 * g + k];
          s16[g] = static_cast<std::int16_t>(sum);
        }
      }
    }
  }

  ActFormat format_ = ActFormat::Q8x32;
  std::size_t n_ = 0;
  std::int64_t cols_ = 0, nb_ = 0;
  std::vector<std::int8_t> q_;
  std::vector<float> d_;
  std::vector<std::int16_t> sums16_;
};

}  // namespace kvdrive::llama::quant
