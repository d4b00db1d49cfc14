// TokenKeys: every sealed page's keys, token by token, at 4 bits: the coded key copies an index
// keeps so that it can score candidate pages token by token (index::TokenRescore) from its own
// state, never from page bytes in a tier (Decisions 2 and 7).
//
// Coding (symmetric; normalised per channel, scaled per token; a page's mean coded apart):
//   - per stream, a channel scale s_c: the root mean square of the first keys' residuals from
//     their page means, k_c - m_c (a floor keeps it positive), so channels are alike in size
//     whatever their magnitude (SmolLM2 has key channels at 4-16x the median's size);
//   - per page, its mean m coded first, as a token: t_m = max_c |m_c / s_c| / 7 and codes
//     round(m_c / (s_c t_m)) in [-7, 7]; then each token's residual from the coded mean,
//     r = k - m^, the same way with its own t. A key's estimate is m^ + r^. Coding residuals is
//     what makes 4 bits enough: RoPE turns a key's large channels with its position, so channel
//     statistics of the first keys fit later keys badly, but a page's tokens are neighbours
//     (on SmolLM2's traces the budget's pages keep 0.95 of the oracle's attention mass, 0.81
//     with keys coded whole; docs/indices.md, "TokenRescore");
//   - codes are stored + 8 as nibbles; byte i of a token holds channel i (low nibble) and
//     channel i + d/2 (high), so unpacking gives the two halves of the key contiguously. A
//     residual larger than the first keys' widens its token's t; nothing clips.
// A token's estimate for query q is sum_c (q_c s_c)(t_m (mcode_c - 8) + t (code_c - 8)).
// fold_query multiplies the query by the channel scales and the softmax scale once per selection
// and codes each head at 8 bits (its largest magnitude / 127), so every dot product is exact
// integer arithmetic (AVX2's byte multiply-adds on the CPU): sum_c q8_c u_c - 8 sum_c q8_c, u_c
// the stored nibble.
//
// A page row is (tokens + 1) x d/2 code bytes (the tokens', then the mean's), then tokens + 1
// float scales: 324 bytes for SmolLM2's page (8 tokens x 64 channels), against Quest's 256 (f16
// minima and maxima) and the 1,024 bytes of the page's f16 keys. The per-token arithmetic is
// KVD_HOST_DEVICE (token_code_dot, token_page_estimate): cuda/token_rescore.cuh calls it, and the
// CPU tests check the AVX2 loop (token_page_estimates) against it.
#pragma once

#include <algorithm>
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
#include "kvdrive/index/token_keys_avx2.hpp"

namespace kvdrive::index {

/// The largest code magnitude: codes are -7..7, stored + 8 in a nibble.
inline constexpr int kTokenCodeMax = 7;

/// Bytes of one page row: the tokens' codes and the mean's, then their float scales.
KVD_HOST_DEVICE std::size_t token_row_bytes(int tokens, int head_dim) {
  return static_cast<std::size_t>(tokens + 1) * (static_cast<std::size_t>(head_dim) / 2 + sizeof(float));
}

/// sum_c q8_c u_c over one token's d/2 code bytes (u_c the stored nibble: low nibbles are
/// channels 0..d/2-1, high ones d/2..d-1): exact integer arithmetic.
KVD_HOST_DEVICE int token_code_dot(const std::int8_t* q8, const std::uint8_t* codes, int d) {
  const int half = d / 2;
  int sum = 0;
  for (int i = 0; i < half; ++i)
    sum += static_cast<int>(q8[i]) * static_cast<int>(codes[i] & 0xFu) + static_cast<int>(q8[half + i]) * static_cast<int>(codes[i] >> 4);
  return sum;
}

/// Token t's scale from a page row (t = tokens: the page mean's).
KVD_HOST_DEVICE float token_scale(const std::uint8_t* row, int tokens, int d, int t) {
  float s;
  std::memcpy(&s, row + static_cast<std::size_t>(tokens + 1) * (d / 2) + static_cast<std::size_t>(t) * sizeof(float), sizeof s);
  return s;
}

/// A token's estimated score: its exact integer dot product less 8 x the query codes' sum (the
/// codes' offset), times the query head's and the token's scales.
KVD_HOST_DEVICE float token_score(int dot, int q_sum, float q_scale, float t_scale) {
  return static_cast<float>(dot - 8 * q_sum) * (q_scale * t_scale);
}

/// One page's estimate for one query head (q8, q_scale, q_sum from TokenKeys::fold_query): the
/// log-sum-exp of its tokens' estimated scores (the mean's score plus each residual's), i.e.
/// the log of the page's attention mass up to the softmax's normaliser (max_token false), or
/// the largest of them (max_token true).
KVD_HOST_DEVICE float token_page_estimate(const std::int8_t* q8, float q_scale, int q_sum, const std::uint8_t* row, int tokens, int d,
                                          bool max_token) {
  const int mean_dot = token_code_dot(q8, row + static_cast<std::size_t>(tokens) * (d / 2), d);
  const float mean = token_score(mean_dot, q_sum, q_scale, token_scale(row, tokens, d, tokens));
  float m = -INFINITY, sum = 0.0f;
  for (int t = 0; t < tokens; ++t) {
    const int dot = token_code_dot(q8, row + static_cast<std::size_t>(t) * (d / 2), d);
    const float s = token_score(dot, q_sum, q_scale, token_scale(row, tokens, d, t)) + mean;
    if (s > m) {
      sum = (m == -INFINITY ? 0.0f : sum * attention::exp_shifted(m - s)) + 1.0f;
      m = s;
    } else {
      sum += attention::exp_shifted(s - m);
    }
  }
  return max_token || m == -INFINITY ? m : m + logf(sum);
}

/// A GQA group's query heads as TokenKeys::fold_query codes them.
struct TokenQuery {
  std::vector<std::int8_t> q8;  ///< [group][head_dim]
  std::vector<float> scale;     ///< [group]: each head's unit
  std::vector<int> sum;         ///< [group]: each head's sum of codes
};

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
      code_page(k.page(p), row.data());
      codes_.push(row.data());
    }
  }

  /// The group's query heads folded for the estimates: q[h][c] x scale x s_c, coded per head at
  /// 8 bits (its largest magnitude / 127, rounded to nearest).
  void fold_query(const IndexQuery& q, TokenQuery& out) const {
    out.q8.resize(static_cast<std::size_t>(q.group) * d_);
    out.scale.resize(static_cast<std::size_t>(q.group));
    out.sum.resize(static_cast<std::size_t>(q.group));
    thread_local std::vector<float> f;
    f.resize(static_cast<std::size_t>(d_));
    for (int h = 0; h < q.group; ++h) {
      float top = 0.0f;
      for (int c = 0; c < d_; ++c) {
        const float x = q.q[static_cast<std::size_t>(h) * d_ + c] * q.scale * scales_[static_cast<std::size_t>(c)];
        f[static_cast<std::size_t>(c)] = x;
        top = std::fabs(x) > top ? std::fabs(x) : top;  // NaN never wins
      }
      const float unit = std::isfinite(top) ? top / 127.0f : 0.0f, inv = unit > 0.0f ? 1.0f / unit : 0.0f;
      int sum = 0;
      for (int c = 0; c < d_; ++c) {
        const float r = std::rint(f[static_cast<std::size_t>(c)] * inv);
        const int v = r > 127.0f ? 127 : r < -127.0f ? -127 : static_cast<int>(r == r ? r : 0.0f);
        out.q8[static_cast<std::size_t>(h) * d_ + c] = static_cast<std::int8_t>(v);
        sum += v;
      }
      out.scale[static_cast<std::size_t>(h)] = unit;
      out.sum[static_cast<std::size_t>(h)] = sum;
    }
  }

 private:
  void start(const PageKeys& k) {
    tokens_ = k.page_tokens;
    d_ = k.head_dim;
    codes_ = CodeStore<std::uint8_t>(token_row_bytes(tokens_, d_));
    // The root mean square of each channel's residuals from their page means over the first
    // keys: a token far out in one channel (an attention sink, say) widens its own token scale,
    // not the channel's for every token.
    std::vector<double> squares(static_cast<std::size_t>(d_), 0.0);
    std::vector<float> mean(static_cast<std::size_t>(d_));
    for (std::int64_t p = 0; p < k.pages; ++p) {
      std::fill(mean.begin(), mean.end(), 0.0f);
      page_mean(k.page(p), mean.data());
      for (int t = 0; t < tokens_; ++t)
        for (int c = 0; c < d_; ++c) {
          const double x = static_cast<double>(k.page(p)[static_cast<std::size_t>(t) * d_ + c]) - mean[static_cast<std::size_t>(c)];
          if (std::isfinite(x)) squares[static_cast<std::size_t>(c)] += x * x;
        }
    }
    const std::int64_t n = k.pages * tokens_;
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

  /// Codes one page into a row: its mean as row `tokens`, then each token's residual from the
  /// coded mean.
  void code_page(const float* keys, std::uint8_t* row) const {
    thread_local std::vector<float> mean, residual;
    mean.assign(static_cast<std::size_t>(d_), 0.0f);
    residual.resize(static_cast<std::size_t>(d_));
    page_mean(keys, mean.data());
    const std::size_t half = static_cast<std::size_t>(d_ / 2), scales = static_cast<std::size_t>(tokens_ + 1) * half;
    auto put = [&](int t, const float* x) {
      const float scale = code_token(x, row + static_cast<std::size_t>(t) * half);
      std::memcpy(row + scales + static_cast<std::size_t>(t) * sizeof(float), &scale, sizeof scale);
      return scale;
    };
    const float mt = put(tokens_, mean.data());
    const std::uint8_t* mcodes = row + static_cast<std::size_t>(tokens_) * half;
    for (int c = 0; c < d_; ++c) mean[static_cast<std::size_t>(c)] = decode(mcodes, mt, c);  // the coded mean
    for (int t = 0; t < tokens_; ++t) {
      const float* key = keys + static_cast<std::size_t>(t) * d_;
      for (int c = 0; c < d_; ++c) residual[static_cast<std::size_t>(c)] = key[c] - mean[static_cast<std::size_t>(c)];
      put(t, residual.data());
    }
  }

  /// The mean of a page's tokens' keys (a non-finite key value counts as 0).
  void page_mean(const float* keys, float* mean) const {
    for (int t = 0; t < tokens_; ++t)
      for (int c = 0; c < d_; ++c) {
        const float x = keys[static_cast<std::size_t>(t) * d_ + c];
        mean[c] += std::isfinite(x) ? x : 0.0f;
      }
    for (int c = 0; c < d_; ++c) mean[c] /= static_cast<float>(tokens_);
  }

  /// Channel c of a coded vector (codes, scale t) in key units.
  float decode(const std::uint8_t* codes, float t, int c) const {
    const int half = d_ / 2;
    const int u = c < half ? codes[c] & 0xF : codes[c - half] >> 4;
    return static_cast<float>(u - 8) * t * scales_[static_cast<std::size_t>(c)];
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

/// est[h * stride + i] = token_page_estimate(head h of q, rows[i], ...) for the group's heads
/// and n page rows: AVX2 where the compiler targets it and d is a multiple of 64 (the same
/// token scores; the log-sum-exp equal within rounding), else the KVD_HOST_DEVICE loop.
inline void token_page_estimates(const TokenQuery& q, int group, const std::uint8_t* const* rows, std::size_t n, int tokens, int d,
                                 bool max_token, float* est, std::size_t stride) {
#if KVD_CPU_AVX2
  if (d % 64 == 0) {
    const TokenQueryView v{q.q8.data(), q.scale.data(), q.sum.data(), group, d};
    return token_page_estimates_avx2(v, rows, n, tokens, max_token, est, stride);
  }
#endif
  for (std::size_t i = 0; i < n; ++i)
    for (int h = 0; h < group; ++h) {
      const auto hh = static_cast<std::size_t>(h);
      est[hh * stride + i] = token_page_estimate(q.q8.data() + hh * d, q.scale[hh], q.sum[hh], rows[i], tokens, d, max_token);
    }
}

}  // namespace kvdrive::index
