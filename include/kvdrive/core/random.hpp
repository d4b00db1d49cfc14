// A small seeded generator for the library's own randomised structures (SimHash hyperplanes,
// k-means initial codewords). SplitMix64 (Steele, Lea and Flood, 2014) and a Box-Muller normal
// sampler written here rather than <random>'s distributions, whose output the standard leaves
// to each implementation: the integer stream is the same everywhere, and the normals differ
// between C libraries only by the last bits of std::log and std::cos.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace kvdrive {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n), n > 0 (modulo: the bias is below n / 2^64).
  std::uint64_t below(std::uint64_t n) { return next() % n; }
  /// Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = static_cast<double>((next() >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kvdrive
