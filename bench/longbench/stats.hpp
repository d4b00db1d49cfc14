// kvd-longbench's statistics: a mean score with its 95% interval (Wilson's for right/wrong
// scores, the normal one over the samples' spread for partial scores), and the distances between
// two next-token distributions that teacher-forced fidelity reports.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace kvdrive::longbench {

struct Interval {
  double mean = 0, low = 0, high = 0;
  std::size_t n = 0;
};

/// The mean of scores in [0, 1] and its 95% interval.
inline Interval interval95(const std::vector<double>& scores) {
  Interval r;
  r.n = scores.size();
  if (r.n == 0) return r;
  const double n = static_cast<double>(r.n), z = 1.959964;
  double sum = 0;
  bool binary = true;
  for (double s : scores) sum += s, binary = binary && (s == 0.0 || s == 1.0);
  r.mean = sum / n;
  if (binary) {  // Wilson score interval
    const double z2 = z * z, centre = (r.mean + z2 / (2 * n)) / (1 + z2 / n);
    const double half = z / (1 + z2 / n) * std::sqrt(r.mean * (1 - r.mean) / n + z2 / (4 * n * n));
    r.low = centre - half, r.high = centre + half;
  } else {
    double ss = 0;
    for (double s : scores) ss += (s - r.mean) * (s - r.mean);
    const double half = r.n > 1 ? z * std::sqrt(ss / (n - 1) / n) : 1.0;
    r.low = r.mean - half, r.high = r.mean + half;
  }
  r.low = std::clamp(r.low, 0.0, 1.0), r.high = std::clamp(r.high, 0.0, 1.0);
  return r;
}

/// The paired difference mean(a - b) of two configurations' scores on the same samples, with its
/// 95% interval (normal, over the per-sample differences): paired, it is much narrower than the
/// two accuracies' own intervals when the configurations mostly agree.
inline Interval paired_difference95(const std::vector<double>& a, const std::vector<double>& b) {
  Interval r;
  r.n = std::min(a.size(), b.size());
  if (r.n == 0) return r;
  const double n = static_cast<double>(r.n), z = 1.959964;
  double sum = 0;
  for (std::size_t i = 0; i < r.n; ++i) sum += a[i] - b[i];
  r.mean = sum / n;
  double ss = 0;
  for (std::size_t i = 0; i < r.n; ++i) ss += (a[i] - b[i] - r.mean) * (a[i] - b[i] - r.mean);
  const double half = r.n > 1 ? z * std::sqrt(ss / (n - 1) / n) : 1.0;
  r.low = std::max(-1.0, r.mean - half), r.high = std::min(1.0, r.mean + half);
  return r;
}

/// Depth bands of a needle's position in its document: 0-33%, 33-67%, 67-100%.
inline constexpr int kDepthBands = 3;
inline int depth_band(double depth) { return std::clamp(static_cast<int>(depth * kDepthBands), 0, kDepthBands - 1); }
inline const char* depth_band_name(int band) {
  constexpr const char* names[kDepthBands] = {"0-33%", "33-67%", "67-100%"};
  return names[std::clamp(band, 0, kDepthBands - 1)];
}

/// log-softmax of logits, in double.
inline std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x) - top);
  const double lz = top + std::log(z);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lz;
  return out;
}

/// KL(p || q) in nats, from log-probabilities.
inline double kl_divergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (std::size_t i = 0; i < log_p.size(); ++i) kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  return std::max(0.0, kl);
}

}  // namespace kvdrive::longbench
