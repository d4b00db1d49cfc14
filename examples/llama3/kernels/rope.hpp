// Rotary position embedding for both layouts, with Llama-3 frequency scaling (as parameters, or
// as per-frequency divisors the way GGUF files store it). The inverse frequencies of a head are
// computed once; rotate() applies them to every head of a q or k row.
#pragma once

#include <cmath>
#include <vector>

#include "model/model.hpp"

namespace kvdrive::llama {

class Rope {
 public:
  Rope() = default;
  /// freq_factors: head_dim / 2 divisors of the frequencies (GGUF's rope_freqs.weight); when
  /// given, they replace `scaling`.
  Rope(int head_dim, double theta, RopeLayout layout, RopeScaling scaling = {}, const std::vector<float>& freq_factors = {})
      : head_dim_(head_dim), layout_(layout), inv_freq_(static_cast<std::size_t>(head_dim / 2)) {
    constexpr double kPi = 3.14159265358979323846;
    for (int i = 0; i < head_dim / 2; ++i) {
      double f = 1.0 / std::pow(theta, 2.0 * i / head_dim);
      if (!freq_factors.empty()) {
        f /= static_cast<double>(freq_factors.at(static_cast<std::size_t>(i)));
      } else if (scaling.factor > 0) {  // Llama-3: stretch low frequencies, keep high ones, blend between
        const double wavelen = 2 * kPi / f;
        const double low_wavelen = scaling.original_max_position / scaling.low_freq_factor;
        const double high_wavelen = scaling.original_max_position / scaling.high_freq_factor;
        if (wavelen > low_wavelen) {
          f /= scaling.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth =
              (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
          f = (1 - smooth) * f / scaling.factor + smooth * f;
        }
      }
      inv_freq_[static_cast<std::size_t>(i)] = f;
    }
  }

  int head_dim() const { return head_dim_; }
  double inv_freq(int i) const { return inv_freq_[static_cast<std::size_t>(i)]; }

  /// Rotates `heads` consecutive heads of x (each head_dim floats) to position pos.
  void rotate(float* x, int heads, long pos) const {
    const int half = head_dim_ / 2;
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq_[static_cast<std::size_t>(i)];
      const auto c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      const int a = layout_ == RopeLayout::interleaved ? 2 * i : i;
      const int b = layout_ == RopeLayout::interleaved ? 2 * i + 1 : i + half;
      for (int h = 0; h < heads; ++h) {
        float* xh = x + static_cast<std::size_t>(h) * head_dim_;
        const float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * c - x1 * s;
        xh[b] = x0 * s + x1 * c;
      }
    }
  }

 private:
  int head_dim_ = 0;
  RopeLayout layout_ = RopeLayout::interleaved;
  std::vector<double> inv_freq_;
};

}  // namespace kvdrive::llama
