// Helpers shared by the tests: the size scale, seeded random data, a temporary directory and a
// double-precision reference of decode attention.
#pragma once

#include <stdlib.h>  // mkdtemp

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvdrive::test {

/// Flips bits of one byte of a file (damage for the checksum tests); throws if it cannot.
inline void flip_byte(const std::string& path, std::uint64_t at, unsigned char mask = 0x10) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  if (!f.seekg(static_cast<std::streamoff>(at)) || !f.read(&c, 1)) throw std::runtime_error("flip_byte: cannot read " + path);
  c = static_cast<char>(static_cast<unsigned char>(c) ^ mask);
  if (!f.seekp(static_cast<std::streamoff>(at)) || !f.write(&c, 1)) throw std::runtime_error("flip_byte: cannot write " + path);
}

/// A fresh directory under the system's temporary directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvd_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("cannot make a temporary directory");
    path = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const char* name) const { return (path / name).string(); }
};

/// KVD_TEST_SCALE (default 1) multiplies the sizes of the larger tests.
inline int scale() {
  const char* s = std::getenv("KVD_TEST_SCALE");
  const int v = s ? std::atoi(s) : 1;
  return v > 0 ? v : 1;
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Softmax attention of one head in double precision over tokens [n][d] given as float rows.
/// Returns the output (d values) and writes the log-sum-exp to *lse.
inline std::vector<double> reference_attention(const float* q, const std::vector<const float*>& k, const std::vector<const float*>& v, int d,
                                               double scale, double* lse = nullptr) {
  std::vector<double> s(k.size());
  double m = -INFINITY;
  for (std::size_t t = 0; t < k.size(); ++t) {
    double dot = 0;
    for (int j = 0; j < d; ++j) dot += static_cast<double>(q[j]) * k[t][j];
    s[t] = dot * scale;
    m = std::max(m, s[t]);
  }
  double l = 0;
  std::vector<double> out(static_cast<std::size_t>(d), 0.0);
  for (std::size_t t = 0; t < k.size(); ++t) {
    const double w = std::exp(s[t] - m);
    l += w;
    for (int j = 0; j < d; ++j) out[j] += w * v[t][j];
  }
  for (auto& x : out) x /= l;
  if (lse) *lse = m + std::log(l);
  return out;
}

}  // namespace kvdrive::test
