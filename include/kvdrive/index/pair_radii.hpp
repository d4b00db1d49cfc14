// Rotary-pair radii: a page summary that keeps what a page mean loses on real attention. RoPE
// rotates a key's channels in pairs; in a pair that turns slowly the page's tokens point one way
// and the mean keeps them, but a single dominant token (the common case in the early-middle
// layers of a real model, docs/indices.md "On real attention") is diluted 8x in the mean. Per
// page and pair j, rho_j = max over the page's tokens of || k_t[pair j] - mean[pair j] ||; a
// query's estimate of the page is q . mean + weight * sum_j || q[pair j] || * rho_j over a few
// pairs chosen per stream from its keys (by mean || mean[pair] || x mean rho over its pages: the
// pairs where pages are both large and spread). On a real SmolLM2 trace 2-4 pairs bring a page
// mean's flat recall from 0.831 to 0.907 (Quest: 0.902) at 0.52-0.53x Quest's bytes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvdrive/core/half.hpp"
#include "kvdrive/core/host_device.hpp"
#include "kvdrive/index/concept.hpp"

namespace kvdrive::index {

/// How a model's RoPE pairs the channels of a head: adjacent (2j, 2j + 1), as GGUF Llama files and
/// llama.cpp rotate; halves (j, j + head_dim / 2), as Hugging Face checkpoints do.
enum class RotaryPairs : std::uint8_t { adjacent, halves };

/// Channel `which` (0 or 1) of rotary pair j.
KVD_HOST_DEVICE int pair_channel(RotaryPairs r, int j, int which, int head_dim) {
  return r == RotaryPairs::adjacent ? 2 * j + which : j + which * (head_dim / 2);
}

/// || x[pair j] ||.
KVD_HOST_DEVICE float pair_norm(const float* x, RotaryPairs r, int j, int head_dim) {
  const float a = x[pair_channel(r, j, 0, head_dim)], b = x[pair_channel(r, j, 1, head_dim)];
  return sqrtf(a * a + b * b);
}

/// rho[j] = max over page p's tokens of || k_t[pair j] - mean[pair j] || for all head_dim / 2
/// pairs; `mean` is the page mean as the index stores it (rounded to its dtype).
inline void page_pair_radii(const PageKeys& k, std::int64_t p, const float* mean, RotaryPairs r, float* rho) {
  const int d = k.head_dim, pairs = d / 2;
  std::fill(rho, rho + pairs, 0.0f);
  const float* page = k.page(p);
  for (int t = 0; t < k.page_tokens; ++t) {
    const float* key = page + static_cast<std::size_t>(t) * d;
    for (int j = 0; j < pairs; ++j) {
      const int a = pair_channel(r, j, 0, d), b = pair_channel(r, j, 1, d);
      const float x = key[a] - mean[a], y = key[b] - mean[b];
      rho[j] = std::max(rho[j], std::sqrt(x * x + y * y));
    }
  }
}

/// The `count` pairs of a stream, from its pages' means [pages][head_dim] and all-pair radii
/// [pages][head_dim / 2]: highest mean || mean[pair] || x mean rho first (ties: the lower pair).
inline std::vector<std::uint8_t> choose_pairs(const float* means, const float* rho, std::int64_t pages, int head_dim, int count, RotaryPairs r) {
  const int pairs = head_dim / 2;
  std::vector<double> norm(static_cast<std::size_t>(pairs), 0.0), radius(static_cast<std::size_t>(pairs), 0.0);
  for (std::int64_t p = 0; p < pages; ++p)
    for (int j = 0; j < pairs; ++j) {
      norm[static_cast<std::size_t>(j)] += pair_norm(means + static_cast<std::size_t>(p) * head_dim, r, j, head_dim);
      radius[static_cast<std::size_t>(j)] += rho[static_cast<std::size_t>(p) * pairs + j];
    }
  std::vector<int> order(static_cast<std::size_t>(pairs));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return norm[static_cast<std::size_t>(a)] * radius[static_cast<std::size_t>(a)] >
           norm[static_cast<std::size_t>(b)] * radius[static_cast<std::size_t>(b)];
  });
  std::vector<std::uint8_t> out;
  for (int i = 0; i < std::min(count, pairs); ++i) out.push_back(static_cast<std::uint8_t>(order[static_cast<std::size_t>(i)]));
  return out;
}

/// weight * sum_i || q[pair i] || * radii[i] over the chosen pairs: what a member's estimate adds
/// to q . mean. q_pair_norm holds || q[pair i] || for the chosen pairs, in their order.
template <class T>
KVD_HOST_DEVICE float pair_bonus(const float* q_pair_norm, const T* radii, int count, float weight) {
  float s = 0.0f;
  for (int i = 0; i < count; ++i) s += q_pair_norm[i] * to_float(radii[i]);
  return weight * s;
}

/// pair_bonus for two pairs, written out: the same arithmetic, in a form that vectorises.
KVD_HOST_DEVICE float pair_bonus2(const float* q_pair_norm, const float* radii, float weight) {
  float s = 0.0f;
  s += q_pair_norm[0] * radii[0];
  s += q_pair_norm[1] * radii[1];
  return weight * s;
}

}  // namespace kvdrive::index
