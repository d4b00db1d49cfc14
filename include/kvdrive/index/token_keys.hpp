// TokenKeys: every sealed page's keys, token by token, at 4 bits, and its mean at 7 bits with two
// rotary-pair radii: the coded key copies an index keeps so that it can rank every candidate page
// cheaply (the first look) and score a pool of them token by token (index::TokenRescore) from its
// own state, never from page bytes in a tier (Decisions 2 and 7).
//
// Coding (symmetric; normalised per channel, scaled per row):
//   - per stream, a channel scale s_c: the root mean square of the first keys' residuals from
//     their page means, k_c - m_c (a floor keeps it positive), so channels are alike in size
//     whatever their magnitude (SmolLM2 has key channels at 4-16x the median's size);
//   - per page, its mean m coded first, at 7 bits: t_m = max_c |m_c / s_c| / 63 and codes
//     round(m_c / (s_c t_m)) in [-63, 63], stored + 64, one byte per channel; then each token's
//     residual from the coded mean, r = k - m^, at 4 bits with its own t: codes in [-7, 7]
//     stored + 8 as nibbles, byte i of a token holding channel i (low nibble) and channel i + d/2
//     (high), so unpacking gives the two halves of the key contiguously. A key's estimate is
//     m^ + r^. Coding residuals is what makes 4 bits enough: RoPE turns a key's large channels
//     with its position, so channel statistics of the first keys fit later keys badly, but a
//     page's tokens are neighbours (on SmolLM2's traces the budget's pages keep 0.95 of the
//     oracle's attention mass, 0.81 with keys coded whole; docs/indices.md, "TokenRescore"). A
//     residual larger than the first keys' widens its token's t; nothing clips;
//   - per page, the radii rho_j = max_t || k_t[pair j] - m[pair j] || of the stream's two rotary
//     pairs where pages are both large and spread (chosen from the first keys, as Hierarchical
//     chooses its members' pairs: index/pair_radii.hpp).
// The first look at a page is Hierarchical's member estimate, q . m^ + w sum_j ||q[pair j]|| rho_j
// (x the softmax scale): the page's best token, which a mean dilutes, lifts it through its radius.
// The second look is the log-sum-exp over its tokens of q . (m^ + r^).
// fold_query multiplies the query by the channel scales and the softmax scale once per selection
// and codes each head at 8 bits (its largest magnitude / 127), so every dot product is exact
// integer arithmetic (AVX2's byte multiply-adds on the CPU): sum_c q8_c u_c - offset sum_c q8_c,
// u_c the stored code.
//
// A page row is tokens x d/2 residual bytes, d mean bytes, tokens + 1 float scales (the tokens',
// then the mean's) and two float radii: 364 bytes for SmolLM2's page (8 tokens x 64 channels),
// against Quest's 256 (f16 minima and maxima) and the 1,024 bytes of the page's f16 keys. The
// arithmetic is KVD_HOST_DEVICE (token_code_dot, token_mean_score, token_first_look,
// token_page_estimate): cuda/token_rescore.cuh calls it, and the CPU tests check the AVX2 loops
// (token_first_looks, token_page_estimates) against it.
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
#include "kvdrive/index/pair_radii.hpp"
#include "kvdrive/index/token_keys_avx2.hpp"

namespace kvdrive::index {

/// The largest residual code magnitude: codes are -7..7, stored + 8 in a nibble.
inline constexpr int kTokenCodeMax = 7;
/// The largest mean code magnitude: codes are -63..63, stored + 64 in a byte (so a byte
/// multiply-add of two codes and two 8-bit query codes fits in int16).
inline constexpr int kTokenMeanCodeMax = 63;
/// Rotary-pair radii per page (fewer when the head has fewer pairs; the rest are 0).
inline constexpr int kTokenRadii = 2;
static_assert(kTokenRadii == 2, "token_first_looks_avx2 reads two radii a row");

/// Bytes of one page row: the tokens' residual codes, the mean's codes, the float scales (tokens',
/// then the mean's) and the float radii.
KVD_HOST_DEVICE std::size_t token_row_bytes(int tokens, int head_dim) {
  return static_cast<std::size_t>(tokens) * (static_cast<std::size_t>(head_dim) / 2) + static_cast<std::size_t>(head_dim) +
         static_cast<std::size_t>(tokens + 1 + kTokenRadii) * sizeof(float);
}

/// Where a page row's mean codes start.
KVD_HOST_DEVICE const std::uint8_t* token_mean_codes(const std::uint8_t* row, int tokens, int d) {
  return row + static_cast<std::size_t>(tokens) * (d / 2);
}

/// Float f of a row's trailer: t < tokens a token's scale, tokens the mean's, tokens + 1 + j
/// radius j.
KVD_HOST_DEVICE float token_row_float(const std::uint8_t* row, int tokens, int d, int f) {
  float s;
  std::memcpy(&s, row + static_cast<std::size_t>(tokens) * (d / 2) + static_cast<std::size_t>(d) + static_cast<std::size_t>(f) * sizeof(float),
              sizeof s);
  return s;
}

/// Token t's scale from a page row (t = tokens: the page mean's).
KVD_HOST_DEVICE float token_scale(const std::uint8_t* row, int tokens, int d, int t) { return token_row_float(row, tokens, d, t); }

/// sum_c q8_c u_c over one token's d/2 code bytes (u_c the stored nibble: low nibbles are
/// channels 0..d/2-1, high ones d/2..d-1): exact integer arithmetic.
KVD_HOST_DEVICE int token_code_dot(const std::int8_t* q8, const std::uint8_t* codes, int d) {
  const int half = d / 2;
  int sum = 0;
  for (int i = 0; i < half; ++i)
    sum += static_cast<int>(q8[i]) * static_cast<int>(codes[i] & 0xFu) + static_cast<int>(q8[half + i]) * static_cast<int>(codes[i] >> 4);
  return sum;
}

/// sum_c q8_c u_c over a page mean's d code bytes: exact integer arithmetic.
KVD_HOST_DEVICE int token_mean_dot(const std::int8_t* q8, const std::uint8_t* codes, int d) {
  int sum = 0;
  for (int c = 0; c < d; ++c) sum += static_cast<int>(q8[c]) * static_cast<int>(codes[c]);
  return sum;
}

/// A row's estimated score: its exact integer dot product less the codes' offset x the query
/// codes' sum, times the query head's and the row's scales.
KVD_HOST_DEVICE float token_score(int dot, int offset, int q_sum, float q_scale, float t_scale) {
  return static_cast<float>(dot - offset * q_sum) * (q_scale * t_scale);
}

/// The page mean's estimated score for one query head: q . m^ x the softmax scale.
KVD_HOST_DEVICE float token_mean_score(const std::int8_t* q8, float q_scale, int q_sum, const std::uint8_t* row, int tokens, int d) {
  const int dot = token_mean_dot(q8, token_mean_codes(row, tokens, d), d);
  return token_score(dot, kTokenMeanCodeMax + 1, q_sum, q_scale, token_scale(row, tokens, d, tokens));
}

/// The first look at a page for one query head: its mean's score plus sum_j pair_w[j] rho_j
/// (pair_w from TokenKeys::fold_query: the weight x || q[pair j] || x the softmax scale).
KVD_HOST_DEVICE float token_first_look(const std::int8_t* q8, float q_scale, int q_sum, const float* pair_w, const std::uint8_t* row, int tokens,
                                       int d) {
  float bonus = 0.0f;
  for (int j = 0; j < kTokenRadii; ++j) bonus += pair_w[j] * token_row_float(row, tokens, d, tokens + 1 + j);
  return token_mean_score(q8, q_scale, q_sum, row, tokens, d) + bonus;
}

/// One page's estimate for one query head (q8, q_scale, q_sum from TokenKeys::fold_query) given
/// its mean's score (token_mean_score): the log-sum-exp of its tokens' estimated scores (the
/// mean's score plus each residual's), i.e. the log of the page's attention mass up to the
/// softmax's normaliser (max_token false), or the largest of them (max_token true).
KVD_HOST_DEVICE float token_page_estimate_from(float mean, const std::int8_t* q8, float q_scale, int q_sum, const std::uint8_t* row, int tokens,
                                               int d, bool max_token) {
  float m = -INFINITY, sum = 0.0f;
  for (int t = 0; t < tokens; ++t) {
    const int dot = token_code_dot(q8, row + static_cast<std::size_t>(t) * (d / 2), d);
    const float s = token_score(dot, kTokenCodeMax + 1, q_sum, q_scale, token_scale(row, tokens, d, t)) + mean;
    if (s > m) {
      sum = (m == -INFINITY ? 0.0f : sum * attention::exp_rank(m - s)) + 1.0f;
      m = s;
    } else {
      sum += attention::exp_rank(s - m);
    }
  }
  return max_token || m == -INFINITY ? m : m + logf(sum);
}

/// One page's estimate for one query head, its mean's score included.
KVD_HOST_DEVICE float token_page_estimate(const std::int8_t* q8, float q_scale, int q_sum, const std::uint8_t* row, int tokens, int d,
                                          bool max_token) {
  return token_page_estimate_from(token_mean_score(q8, q_scale, q_sum, row, tokens, d), q8, q_scale, q_sum, row, tokens, d, max_token);
}

/// A GQA group's query heads as TokenKeys::fold_query codes them.
struct TokenQuery {
  std::vector<std::int8_t> q8;  ///< [group][head_dim]
  std::vector<float> scale;     ///< [group]: each head's unit
  std::vector<int> sum;         ///< [group]: each head's sum of codes
  std::vector<float> pair_w;    ///< [group][kTokenRadii]: the first look's weight of each radius

  TokenQueryView view(int group, int d) const { return {q8.data(), scale.data(), sum.data(), pair_w.data(), group, d}; }
};

/// The coded keys of one stream: one row per sealed page, page ids 0, 1, ...
class TokenKeys {
 public:
  std::int64_t pages() const { return codes_.rows(); }
  int page_tokens() const { return tokens_; }
  int head_dim() const { return d_; }
  const float* channel_scales() const { return scales_.data(); }
  /// The rotary pairs whose radii each row holds (fixed by the first append).
  const std::vector<std::uint8_t>& pairs() const { return pairs_; }
  const std::uint8_t* row(std::int64_t page) const { return codes_.row(page); }
  std::size_t bytes() const { return codes_.bytes() + scales_.size() * sizeof(float) + pairs_.size(); }

  /// Codes k's pages and appends them; the first call fixes the channel scales and the pairs
  /// (RoPE's pairing `rotary`).
  void append(const PageKeys& k, RotaryPairs rotary = RotaryPairs::adjacent) {
    if (k.pages <= 0) return;
    if (scales_.empty()) start(k, rotary);
    std::vector<std::uint8_t> row(token_row_bytes(tokens_, d_));
    for (std::int64_t p = 0; p < k.pages; ++p) {
      code_page(k.page(p), row.data());
      codes_.push(row.data());
    }
  }

  /// The group's query heads folded for the estimates: q[h][c] x scale x s_c, coded per head at
  /// 8 bits (its largest magnitude / 127, rounded to nearest); and the first look's weights
  /// pair_weight x || q[h][pair j] || x scale.
  void fold_query(const IndexQuery& q, TokenQuery& out, float pair_weight = 0.5f) const {
    out.q8.resize(static_cast<std::size_t>(q.group) * d_);
    out.scale.resize(static_cast<std::size_t>(q.group));
    out.sum.resize(static_cast<std::size_t>(q.group));
    out.pair_w.assign(static_cast<std::size_t>(q.group) * kTokenRadii, 0.0f);
    for (int h = 0; h < q.group; ++h) {
      const float* qh = q.q + static_cast<std::size_t>(h) * d_;
      fold_head(qh, q.scale, out.q8.data() + static_cast<std::size_t>(h) * d_, out.scale[static_cast<std::size_t>(h)],
                out.sum[static_cast<std::size_t>(h)]);
      for (std::size_t j = 0; j < pairs_.size(); ++j)
        out.pair_w[static_cast<std::size_t>(h) * kTokenRadii + j] = pair_weight * q.scale * pair_norm(qh, rotary_, pairs_[j], d_);
    }
  }

 private:
  void fold_head(const float* qh, float softmax_scale, std::int8_t* q8, float& unit, int& sum) const {
    thread_local std::vector<float> f;
    f.resize(static_cast<std::size_t>(d_));
    float top = 0.0f;
    for (int c = 0; c < d_; ++c) {
      const float x = qh[c] * softmax_scale * scales_[static_cast<std::size_t>(c)];
      f[static_cast<std::size_t>(c)] = x;
      top = std::fabs(x) > top ? std::fabs(x) : top;  // NaN never wins
    }
    unit = std::isfinite(top) ? top / 127.0f : 0.0f;
    const float inv = unit > 0.0f ? 1.0f / unit : 0.0f;
    sum = 0;
    for (int c = 0; c < d_; ++c) {
      const float r = std::rint(f[static_cast<std::size_t>(c)] * inv);
      const int v = r > 127.0f ? 127 : r < -127.0f ? -127 : static_cast<int>(r == r ? r : 0.0f);
      q8[c] = static_cast<std::int8_t>(v);
      sum += v;
    }
  }

  void start(const PageKeys& k, RotaryPairs rotary) {
    tokens_ = k.page_tokens;
    d_ = k.head_dim;
    rotary_ = rotary;
    codes_ = CodeStore<std::uint8_t>(token_row_bytes(tokens_, d_));
    // The root mean square of each channel's residuals from their page means over the first
    // keys: a token far out in one channel (an attention sink, say) widens its own token scale,
    // not the channel's for every token. The same keys choose the pairs whose radii rows keep.
    std::vector<double> squares(static_cast<std::size_t>(d_), 0.0);
    std::vector<float> means(static_cast<std::size_t>(k.pages) * d_, 0.0f), rho(static_cast<std::size_t>(k.pages) * (d_ / 2));
    for (std::int64_t p = 0; p < k.pages; ++p) {
      float* mean = means.data() + static_cast<std::size_t>(p) * d_;
      page_mean(k.page(p), mean);
      page_pair_radii(k, p, mean, rotary_, rho.data() + static_cast<std::size_t>(p) * (d_ / 2));
      for (int t = 0; t < tokens_; ++t)
        for (int c = 0; c < d_; ++c) {
          const double x = static_cast<double>(k.page(p)[static_cast<std::size_t>(t) * d_ + c]) - mean[c];
          if (std::isfinite(x)) squares[static_cast<std::size_t>(c)] += x * x;
        }
    }
    pairs_ = choose_pairs(means.data(), rho.data(), k.pages, d_, kTokenRadii, rotary_);
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

  /// Codes one page into a row: its mean at 7 bits, each token's residual from the coded mean at
  /// 4 bits, the scales, then the radii of the stream's pairs.
  void code_page(const float* keys, std::uint8_t* row) const {
    thread_local std::vector<float> mean, residual;
    mean.assign(static_cast<std::size_t>(d_), 0.0f);
    residual.resize(static_cast<std::size_t>(d_));
    page_mean(keys, mean.data());
    const std::size_t half = static_cast<std::size_t>(d_ / 2), floats = static_cast<std::size_t>(tokens_) * half + static_cast<std::size_t>(d_);
    auto put_float = [&](int f, float x) { std::memcpy(row + floats + static_cast<std::size_t>(f) * sizeof(float), &x, sizeof x); };
    for (int j = 0; j < kTokenRadii; ++j)
      put_float(tokens_ + 1 + j, j < static_cast<int>(pairs_.size()) ? radius(keys, mean.data(), pairs_[static_cast<std::size_t>(j)]) : 0.0f);
    std::uint8_t* mcodes = row + static_cast<std::size_t>(tokens_) * half;
    const float mt =
        code_row(mean.data(), kTokenMeanCodeMax, [&](int c, int v) { mcodes[c] = static_cast<std::uint8_t>(v + kTokenMeanCodeMax + 1); });
    put_float(tokens_, mt);
    for (int c = 0; c < d_; ++c)  // the coded mean
      mean[static_cast<std::size_t>(c)] = static_cast<float>(mcodes[c] - kTokenMeanCodeMax - 1) * mt * scales_[static_cast<std::size_t>(c)];
    for (int t = 0; t < tokens_; ++t) {
      const float* key = keys + static_cast<std::size_t>(t) * d_;
      for (int c = 0; c < d_; ++c) residual[static_cast<std::size_t>(c)] = key[c] - mean[static_cast<std::size_t>(c)];
      std::uint8_t* out = row + static_cast<std::size_t>(t) * half;
      std::fill(out, out + half, std::uint8_t{0});
      put_float(t, code_row(residual.data(), kTokenCodeMax, [&](int c, int v) {
                  const auto u = static_cast<std::uint8_t>(v + kTokenCodeMax + 1);
                  out[static_cast<std::size_t>(c) % half] |= static_cast<std::uint8_t>(c < static_cast<int>(half) ? u : u << 4);
                }));
    }
  }

  /// max_t || k_t[pair j] - mean[pair j] || over the page's tokens.
  float radius(const float* keys, const float* mean, int j) const {
    const int a = pair_channel(rotary_, j, 0, d_), b = pair_channel(rotary_, j, 1, d_);
    float r = 0.0f;
    for (int t = 0; t < tokens_; ++t) {
      const float x = keys[static_cast<std::size_t>(t) * d_ + a] - mean[a], y = keys[static_cast<std::size_t>(t) * d_ + b] - mean[b];
      const float n = std::sqrt(x * x + y * y);
      r = n > r ? n : r;  // NaN never wins
    }
    return r;
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

  /// Codes one vector x at `levels` per sign: put(c, code) for each channel; returns its scale t.
  template <class Put>
  float code_row(const float* x, int levels, Put&& put) const {
    float top = 0.0f;
    for (int c = 0; c < d_; ++c) {
      const float a = std::fabs(x[c] * inv_scales_[static_cast<std::size_t>(c)]);
      top = a > top ? a : top;  // NaN never wins
    }
    if (!(top > 0.0f) || !std::isfinite(top)) top = top > 0.0f ? 3.0e38f : 0.0f;
    const float t = top / static_cast<float>(levels), inv = t > 0.0f ? 1.0f / t : 0.0f, lim = static_cast<float>(levels);
    for (int c = 0; c < d_; ++c) {
      const float r = std::rint(x[c] * inv_scales_[static_cast<std::size_t>(c)] * inv);
      put(c, r > lim ? levels : r < -lim ? -levels : static_cast<int>(r == r ? r : 0.0f));
    }
    return t;
  }

  int tokens_ = 0, d_ = 0;
  RotaryPairs rotary_ = RotaryPairs::adjacent;
  CodeStore<std::uint8_t> codes_;
  std::vector<float> scales_, inv_scales_;
  std::vector<std::uint8_t> pairs_;
};

/// est[h * stride + i] = token_first_look(head h of q, rows[i], ...) for the group's heads and n
/// page rows, and where mean is given, mean[h * stride + i] = token_mean_score (the look without
/// the radii): AVX2 where the compiler targets it and d is a multiple of 32 (the same integer
/// dots), else the KVD_HOST_DEVICE loop.
inline void token_first_looks(const TokenQuery& q, int group, const std::uint8_t* const* rows, std::size_t n, int tokens, int d, float* est,
                              std::size_t stride, float* mean = nullptr) {
#if KVD_CPU_AVX2
  if (d % 32 == 0) return token_first_looks_avx2(q.view(group, d), rows, n, tokens, est, stride, mean);
#endif
  for (std::size_t i = 0; i < n; ++i)
    for (int h = 0; h < group; ++h) {
      const auto hh = static_cast<std::size_t>(h);
      est[hh * stride + i] = token_first_look(q.q8.data() + hh * d, q.scale[hh], q.sum[hh], q.pair_w.data() + hh * kTokenRadii, rows[i], tokens, d);
      if (mean) mean[hh * stride + i] = token_mean_score(q.q8.data() + hh * d, q.scale[hh], q.sum[hh], rows[i], tokens, d);
    }
}

/// est[h * stride + i] = token_page_estimate(head h of q, rows[i], ...) for the group's heads
/// and n page rows, from the means' scores mean[h * stride + i] where given (token_first_looks'),
/// else computing them: AVX2 where the compiler targets it and d is a multiple of 64 (the same
/// token scores; the log-sum-exp equal within rounding), else the KVD_HOST_DEVICE loop.
inline void token_page_estimates(const TokenQuery& q, int group, const std::uint8_t* const* rows, std::size_t n, int tokens, int d, bool max_token,
                                 float* est, std::size_t stride, const float* mean = nullptr) {
#if KVD_CPU_AVX2
  if (d % 64 == 0) return token_page_estimates_avx2(q.view(group, d), rows, n, tokens, max_token, est, stride, mean);
#endif
  for (std::size_t i = 0; i < n; ++i)
    for (int h = 0; h < group; ++h) {
      const auto hh = static_cast<std::size_t>(h);
      const std::int8_t* q8 = q.q8.data() + hh * d;
      const float m = mean ? mean[hh * stride + i] : token_mean_score(q8, q.scale[hh], q.sum[hh], rows[i], tokens, d);
      est[hh * stride + i] = token_page_estimate_from(m, q8, q.scale[hh], q.sum[hh], rows[i], tokens, d, max_token);
    }
}

}  // namespace kvdrive::index
