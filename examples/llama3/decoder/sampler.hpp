// Sampling the next token from logits: greedy (temperature 0), or softmax at a temperature,
// optionally restricted to the smallest set of tokens whose probability reaches top_p
// (nucleus sampling). Seeded, so a run is reproducible.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

class Sampler {
 public:
  Sampler(float temperature, float top_p, std::uint64_t seed) : temperature_(temperature), top_p_(top_p), rng_(seed) {
    KVD_EXPECT(temperature >= 0 && std::isfinite(temperature), "temperature {} must be >= 0", temperature);
    KVD_EXPECT(top_p > 0 && top_p <= 1, "top-p {} must be in (0, 1]", top_p);
  }

  /// The index of the largest logit (the first one on ties).
  static int argmax(const std::vector<float>& logits) { return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin()); }

  int sample(const std::vector<float>& logits) {
    if (temperature_ == 0.0f) return argmax(logits);
    const float mx = *std::max_element(logits.begin(), logits.end());
    probs_.resize(logits.size());
    double z = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) z += probs_[i] = std::exp((logits[i] - mx) / temperature_);
    for (auto& p : probs_) p = static_cast<float>(p / z);
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    if (top_p_ >= 1.0f) return draw(probs_, u, 1.0);
    order_.resize(probs_.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::sort(order_.begin(), order_.end(), [&](int a, int b) { return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b); });
    double mass = 0;
    std::size_t keep = 0;
    while (keep < order_.size() && mass < top_p_) mass += probs_[order_[keep++]];
    double acc = 0;
    for (std::size_t i = 0; i < keep; ++i) {
      acc += probs_[order_[i]];
      if (u * mass < acc) return order_[i];
    }
    return order_[keep - 1];
  }

 private:
  static int draw(const std::vector<float>& p, double u, double total) {
    double acc = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      acc += p[i];
      if (u * total < acc) return static_cast<int>(i);
    }
    return static_cast<int>(p.size()) - 1;
  }

  float temperature_, top_p_;
  std::mt19937_64 rng_;
  std::vector<float> probs_;
  std::vector<int> order_;
};

}  // namespace kvdrive::llama
