// TokenKeys: every sealed page's keys, token by token, at 4 bits: the coded key copies an index
// keeps so that it can score candidate pages token by token (index::TokenRescore) from its own
// state, never from page bytes in a tier (Decisions 2 and 7).
//
// Coding (symmetric; normalised per channel, scaled per token):
//   - per stream, a channel scale s_c: the root mean square of k_c over the first keys the store
//     sees (a floor keeps it positive), so channels are alike in size whatever their magnitude
//     (SmolLM2 has key channels at 4-16x the median's size: docs/codecs.md);
//   - per token, t = max_c |k_c / s_c| / 7 and codes round(k_c / (s_c t)) in [-7, 7], stored
//     + 8 as nibbles. A key sealed later may exceed the first keys' scales: its t grows and
//     nothing clips;
//   - byte i of a token holds channel i (low nibble) and channel i + d/2 (high), so unpacking
//     gives the two halves of the key contiguously.
// A token's estimate for a query q is t x sum_c (q_c s_c)(code_c - 8): fold_query multiplies the
// query by the channel scales (and the softmax scale) once per selection.
//
// A page row is tokens x d/2 code bytes, then tokens float scales: 288 bytes for SmolLM2's page
// (8 tokens x 64 channels), against Quest's 256 (f16 minima and maxima) and the 1,024 bytes of
// the page's f16 keys. The per-token arithmetic is KVD_HOST_DEVICE (token_code_dot,
// token_page_estimate): cuda/token_rescore.cuh calls it, and the CPU tests check the AVX2 loop
// (token_page_estimates) against it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/host_device.hpp"
#include "kvdrive/index/code_store.hpp"
#include "kvdrive/index/concept.hpp"

namespace kvdrive::index {

/// The largest code magnitude: codes are -7..7, stored + 8 in a nibble.
inline constexpr int kTokenCodeMax = 7;

/// Bytes of one page row: codes, then one float scale per token.
KVD_HOST_DEVICE std::size_t token_row_bytes(int tokens, int head_dim) {
  return static_cast<std::size_t>(tokens) * (static_cast<std::size_t>(head_dim) / 2 + sizeof(float));
}

/// sum_c qs_c (code_c - 8) over one token's d/2 code bytes (low nibbles: channels 0..d/2-1,
/// high: d/2..d-1), in a fixed order of eight partial sums.
KVD_HOST_DEVICE float token_code_dot(const float* qs, const std::uint8_t* codes, int d) {
  const int half = d / 2;
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < half; ++i) {
    part[i & 3] += qs[i] * static_cast<float>(static_cast<int>(codes[i] & 0xFu) - 8);
    part[4 + (i & 3)] += qs[half + i] * static_cast<float>(static_cast<int>(codes[i] >> 4) - 8);
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/// Token t's scale from a page row.
KVD_HOST_DEVICE float token_scale(const std::uint8_t* row, int tokens, int d, int t) {
  float s;
  std::memcpy(&s, row + static_cast<std::size_t>(tokens) * (d / 2) + static_cast<std::size_t>(t) * sizeof(float), sizeof s);
  return s;
}

/// One page's estimate for one query head (qs folded by fold_query): the log-sum-exp of its
/// tokens' estimated scores, i.e. the log of the page's attention mass up to the softmax's
/// normaliser (max_token false), or the largest of them (max_token true).
KVD_HOST_DEVICE float token_page_estimate(const float* qs, const std::uint8_t* row, int tokens, int d, bool max_token) {
  float m = -INFINITY, sum = 0.0f;
  for (int t = 0; t < tokens; ++t) {
    const float s = token_scale(row, tokens, d, t) * token_code_dot(qs, row + static_cast<std::size_t>(t) * (d / 2), d);
    if (s > m) {
      sum = (m == -INFINITY ? 0.0f : sum * attention::exp_shifted(m - s)) + 1.0f;
      m = s;
    } else {
      sum += attention::exp_shifted(s - m);
    }
  }
  return max_token || m == -INFINITY ? m : m + logf(sum);
}

/// The coded keys of one stream: one row per sealed page, page ids 0, 1, ...
class TokenKeys {
 public:
  std::int64_t pages() const { return codes_.rows(); }
  int page_tokens() const { return tokens_; }
  int head_dim() const { return d_; }
  const float* channel_scales() const { return scales_.data(); }
  const std::uint8_t* row(std::int64_t page) const { return codes_.row(page); }
  std::size_t bytes() const { return codes_.bytes() + scales_.size() * sizeof(float); }

  /// Codes k's pages and appends them; the first call fixes the channel scales.
  void append(const PageKeys& k) {
    if (k.pages <= 0) return;
    if (scales_.empty()) start(k);
    std::vector<std::uint8_t> row(token_row_bytes(tokens_, d_));
    for (std::int64_t p = 0; p < k.pages; ++p) {
      for (int t = 0; t < tokens_; ++t) {
        const float scale = code_token(k.page(p) + static_cast<std::size_t>(t) * d_, row.data() + static_cast<std::size_t>(t) * (d_ / 2));
        std::memcpy(row.data() + static_cast<std::size_t>(tokens_) * (d_ / 2) + static_cast<std::size_t>(t) * sizeof(float), &scale, sizeof scale);
      }
      codes_.push(row.data());
    }
  }

  /// qs[h][c] = q[h][c] x scale x s_c for the group's heads: the query the estimates take.
  void fold_query(const IndexQuery& q, float* qs) const {
    for (int h = 0; h < q.group; ++h)
      for (int c = 0; c < d_; ++c)
        qs[static_cast<std::size_t>(h) * d_ + c] = q.q[static_cast<std::size_t>(h) * d_ + c] * q.scale * scales_[static_cast<std::size_t>(c)];
  }

 private:
  void start(const PageKeys& k) {
    tokens_ = k.page_tokens;
    d_ = k.head_dim;
    codes_ = CodeStore<std::uint8_t>(token_row_bytes(tokens_, d_));
    // The root mean square of each channel over the first keys: a token far out in one channel
    // (an attention sink, say) widens its own token scale, not the channel's for every token.
    std::vector<double> squares(static_cast<std::size_t>(d_), 0.0);
    const std::int64_t n = k.pages * tokens_;
    for (std::int64_t i = 0; i < n; ++i)
      for (int c = 0; c < d_; ++c) {
        const double x = k.data[static_cast<std::size_t>(i) * d_ + c];
        if (std::isfinite(x)) squares[static_cast<std::size_t>(c)] += x * x;
      }
    scales_.assign(static_cast<std::size_t>(d_), 0.0f);
    float top = 0.0f;
    for (int c = 0; c < d_; ++c) {
      scales_[static_cast<std::size_t>(c)] = static_cast<float>(std::sqrt(squares[static_cast<std::size_t>(c)] / static_cast<double>(n)));
      top = scales_[static_cast<std::size_t>(c)] > top ? scales_[static_cast<std::size_t>(c)] : top;
    }
    // A channel that was (nearly) zero so far gets 1/64 of the largest channel's scale, and an
    // all-zero start gets 1: a later key there then codes at a useful resolution.
    const float floor = top > 0.0f && std::isfinite(top) ? top / 64.0f : 1.0f;
    for (float& s : scales_) s = s > floor && std::isfinite(s) ? s : floor;
    inv_scales_.resize(scales_.size());
    for (std::size_t c = 0; c < scales_.size(); ++c) inv_scales_[c] = 1.0f / scales_[c];
  }

  /// Codes one token's key into d/2 bytes; returns its scale t.
  float code_token(const float* key, std::uint8_t* out) const {
    float top = 0.0f;
    for (int c = 0; c < d_; ++c) {
      const float a = std::fabs(key[c] * inv_scales_[static_cast<std::size_t>(c)]);
      top = a > top ? a : top;  // NaN never wins
    }
    if (!(top > 0.0f) || !std::isfinite(top)) top = top > 0.0f ? 3.0e38f : 0.0f;
    const float t = top / kTokenCodeMax, inv = t > 0.0f ? 1.0f / t : 0.0f;
    const int half = d_ / 2;
    auto code = [&](int c) {
      const float r = std::rint(key[c] * inv_scales_[static_cast<std::size_t>(c)] * inv);
      const int v = r > kTokenCodeMax ? kTokenCodeMax : r < -kTokenCodeMax ? -kTokenCodeMax : static_cast<int>(r == r ? r : 0.0f);
      return static_cast<std::uint32_t>(v + 8);
    };
    for (int i = 0; i < half; ++i) out[i] = static_cast<std::uint8_t>(code(i) | (code(half + i) << 4));
    return t;
  }

  int tokens_ = 0, d_ = 0;
  CodeStore<std::uint8_t> codes_;
  std::vector<float> scales_, inv_scales_;
};

#if KVD_CPU_AVX2
namespace detail {
/// Horizontal sum of one vector.
inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/// Eight codes (bytes 0..15 of v, one nibble each, already masked) minus 8, as floats.
inline __m256 codes_to_float(__m128i v) {
  return _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_set1_ps(8.0f));
}

/// Scores of one token for every head of the group (group <= 8): each code converted once.
inline void token_scores_avx2(const float* qs, int group, const std::uint8_t* codes, int d, float* s) {
  const int half = d / 2;
  __m256 acc[8];
  for (int h = 0; h < group; ++h) acc[h] = _mm256_setzero_ps();
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int i = 0; i < half; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m256 c[4] = {codes_to_float(lo), codes_to_float(_mm_srli_si128(lo, 8)), codes_to_float(hi),
                         codes_to_float(_mm_srli_si128(hi, 8))};
    for (int h = 0; h < group; ++h) {
      const float* q = qs + static_cast<std::size_t>(h) * d;
      acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), c[0], acc[h]);
      acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), c[1], acc[h]);
      acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + half + i), c[2], acc[h]);
      acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + half + i + 8), c[3], acc[h]);
    }
  }
  for (int h = 0; h < group; ++h) s[h] = hsum(acc[h]);
}
}  // namespace detail
#endif

/// est[h * stride + i] = token_page_estimate(qs_h, rows[i], ...) for the group's heads and n
/// page rows: AVX2 where the compiler targets it, d is a multiple of 32 and the group at most 8
/// (equal within rounding: another summation order), else the KVD_HOST_DEVICE loop.
inline void token_page_estimates(const float* qs, int group, const std::uint8_t* const* rows, std::size_t n, int tokens, int d,
                                 bool max_token, float* est, std::size_t stride) {
#if KVD_CPU_AVX2
  if (d % 32 == 0 && group <= 8) {
    thread_local std::vector<float> s;  // [group][tokens] scores of one page
    s.resize(static_cast<std::size_t>(group) * tokens);
    float one[8];
    for (std::size_t i = 0; i < n; ++i) {
      for (int t = 0; t < tokens; ++t) {
        detail::token_scores_avx2(qs, group, rows[i] + static_cast<std::size_t>(t) * (d / 2), d, one);
        const float scale = token_scale(rows[i], tokens, d, t);
        for (int h = 0; h < group; ++h) s[static_cast<std::size_t>(h) * tokens + t] = scale * one[h];
      }
      for (int h = 0; h < group; ++h) {
        const float* x = s.data() + static_cast<std::size_t>(h) * tokens;
        float m = -INFINITY, sum = 0.0f;
        for (int t = 0; t < tokens; ++t) m = x[t] > m ? x[t] : m;
        if (!max_token && m != -INFINITY) {
          for (int t = 0; t < tokens; ++t) sum += attention::exp_shifted(x[t] - m);
          m += std::log(sum);
        }
        est[static_cast<std::size_t>(h) * stride + i] = m;
      }
    }
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i)
    for (int h = 0; h < group; ++h)
      est[static_cast<std::size_t>(h) * stride + i] = token_page_estimate(qs + static_cast<std::size_t>(h) * d, rows[i], tokens, d, max_token);
}

}  // namespace kvdrive::index
