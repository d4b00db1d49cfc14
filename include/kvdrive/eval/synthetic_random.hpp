// The synthetic traces' randomness (eval/synthetic.hpp): our own generator (xoshiro256**,
// seeded by splitmix64) and normal sampler (Marsaglia polar), and the seed mixing that derives
// every stream's and every pass's seed from the trace seed. std::normal_distribution is
// implementation-defined, and a trace must be the same whatever the standard library.
#pragma once

#include <cmath>
#include <cstdint>

namespace kvdrive::eval {

namespace synthetic_detail {

inline std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A 64-bit seed from several values (order matters).
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a ^ (b * 0xd1342543de82ef95ull + 0x2545f4914f6cdd1dull);
  splitmix64(x);
  return splitmix64(x);
}
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c) { return mix(mix(a, b), c); }
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) { return mix(mix(a, b, c), d); }

/// xoshiro256** with a Marsaglia polar normal sampler.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n), n >= 1.
  std::uint64_t below(std::uint64_t n) {
    const auto v = static_cast<std::uint64_t>(uniform() * static_cast<double>(n));
    return v < n ? v : n - 1;
  }
  /// Standard normal.
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u, v, r;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      r = u * u + v * v;
    } while (r >= 1.0 || r == 0.0);
    const double f = std::sqrt(-2.0 * std::log(r) / r);
    spare_ = v * f;
    have_spare_ = true;
    return u * f;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
  double spare_ = 0.0;
  bool have_spare_ = false;
};

}  // namespace synthetic_detail

}  // namespace kvdrive::eval
