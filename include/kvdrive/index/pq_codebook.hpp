// Product-quantisation codebooks (namespace index::pq), what index::ProductQuant
// (product_quant.hpp) trains and encodes with: k-means per subspace (Lloyd, seeded initial
// codewords), the channel-major codebook layout encoding and the lookup tables stream, and the
// encoder every encoding goes through. pq::train and pq::encode are the public, checked entry
// points.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/random.hpp"

namespace kvdrive::index {

namespace pq {

/// The largest PQ codebook: a code is one byte.
inline constexpr int kMaxCodewords = 256;

namespace detail {

/// Nearest of C codewords (given transposed: cwt[j * C + c], sub channels) to x; ties go to the
/// lower codeword. dist: C floats of scratch.
inline int nearest(const float* cwt, int C, const float* x, int sub, float* dist) {
  for (int c = 0; c < C; ++c) dist[c] = 0.0f;
  for (int j = 0; j < sub; ++j) {
    const float xj = x[j];
    const float* row = cwt + static_cast<std::size_t>(j) * C;
    for (int c = 0; c < C; ++c) {  // vectorises over codewords
      const float diff = xj - row[c];
      dist[c] += diff * diff;
    }
  }
  int best = 0;
  for (int c = 1; c < C; ++c) best = dist[c] < dist[best] ? c : best;
  return best;
}

/// k-means of n points [n][sub] (contiguous) into C centroids written to cw [C][sub]. Requires
/// 1 <= C <= n. Never throws but for allocation.
inline void kmeans(const float* x, std::int64_t n, int sub, int C, int iterations, std::uint64_t seed, float* cw) {
  const auto s = static_cast<std::size_t>(sub);
  // Initial codewords: C distinct points, a seeded partial Fisher-Yates shuffle.
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  SplitMix64 rng(seed);
  for (int c = 0; c < C; ++c) {
    const auto j = static_cast<std::size_t>(c) + static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(n - c)));
    std::swap(order[static_cast<std::size_t>(c)], order[j]);
    std::copy_n(x + static_cast<std::size_t>(order[static_cast<std::size_t>(c)]) * s, s, cw + static_cast<std::size_t>(c) * s);
  }
  std::vector<float> cwt(s * static_cast<std::size_t>(C)), dist(static_cast<std::size_t>(C));
  std::vector<int> assign(static_cast<std::size_t>(n), -1);
  std::vector<double> sum(s * static_cast<std::size_t>(C));
  std::vector<std::int64_t> count(static_cast<std::size_t>(C));
  for (int it = 0; it < iterations; ++it) {
    for (int c = 0; c < C; ++c)
      for (std::size_t j = 0; j < s; ++j)
        cwt[j * static_cast<std::size_t>(C) + static_cast<std::size_t>(c)] = cw[static_cast<std::size_t>(c) * s + j];
    bool changed = false;
    for (std::int64_t i = 0; i < n; ++i) {
      const int a = nearest(cwt.data(), C, x + static_cast<std::size_t>(i) * s, sub, dist.data());
      changed |= a != assign[static_cast<std::size_t>(i)];
      assign[static_cast<std::size_t>(i)] = a;
    }
    if (!changed) break;
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), 0);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto a = static_cast<std::size_t>(assign[static_cast<std::size_t>(i)]);
      ++count[a];
      for (std::size_t j = 0; j < s; ++j) sum[a * s + j] += x[static_cast<std::size_t>(i) * s + j];
    }
    for (std::size_t c = 0; c < static_cast<std::size_t>(C); ++c)
      if (count[c] > 0)  // an empty cluster keeps its codeword
        for (std::size_t j = 0; j < s; ++j) cw[c * s + j] = static_cast<float>(sum[c * s + j] / static_cast<double>(count[c]));
  }
}

/// cwt[m][j][c] = codebook[m][c][j]: codebooks [M][C][dim / M] laid out channel by channel
/// (dim rows of C), the layout encoding and the lookup tables stream.
inline std::vector<float> transpose_codebook(const float* codebook, int dim, int M, int C) {
  const int sub = dim / M;
  std::vector<float> cwt(static_cast<std::size_t>(C) * static_cast<std::size_t>(dim));
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < sub; ++j)
      for (int c = 0; c < C; ++c) cwt[(static_cast<std::size_t>(m) * sub + j) * C + c] = codebook[(static_cast<std::size_t>(m) * C + c) * sub + j];
  return cwt;
}

/// Encodes vectors against transposed codebooks cwt[m][j][c]: the distances to all C codewords of
/// a subspace accumulate in a loop over codewords that vectorises. Every encoding (the index's
/// and pq::encode) goes through here, so their codes agree exactly.
class Encoder {
 public:
  Encoder(const float* cwt, int dim, int M, int C) : cwt_(cwt), M_(M), C_(C), sub_(dim / M), dist_(static_cast<std::size_t>(C)) {}
  /// codes[m] = nearest codeword of subspace m to x (dim floats); ties to the lower codeword.
  void encode(const float* x, std::uint8_t* codes) {
    for (int m = 0; m < M_; ++m)
      codes[m] = static_cast<std::uint8_t>(
          nearest(cwt_ + static_cast<std::size_t>(m) * sub_ * C_, C_, x + static_cast<std::size_t>(m) * sub_, sub_, dist_.data()));
  }

 private:
  const float* cwt_;
  int M_, C_, sub_;
  std::vector<float> dist_;
};

/// dst[i] = src[i] as float for n elements (F16C / AVX2 where the compiler targets it).
template <class T>
inline void to_float_n(const T* src, std::size_t n, float* dst) {
  std::size_t i = 0;
#if KVD_CPU_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, attention::detail::load8(src + i));
#endif
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

/// pq::train without the argument checks (the index guarantees them).
inline std::vector<float> train_unchecked(const float* points, std::int64_t n, int dim, int M, int C, int iterations, std::uint64_t seed) {
  const int sub = dim / M;
  std::vector<float> book(static_cast<std::size_t>(C) * static_cast<std::size_t>(dim));
  std::vector<float> x(static_cast<std::size_t>(n) * static_cast<std::size_t>(sub));
  for (int m = 0; m < M; ++m) {
    for (std::int64_t i = 0; i < n; ++i)
      std::copy_n(points + static_cast<std::size_t>(i) * dim + static_cast<std::size_t>(m) * sub, sub, x.data() + static_cast<std::size_t>(i) * sub);
    kmeans(x.data(), n, sub, C, iterations, seed + static_cast<std::uint64_t>(m), book.data() + static_cast<std::size_t>(m) * C * sub);
  }
  return book;
}

}  // namespace detail

/// Trains product-quantisation codebooks on n points [n][dim]: M subspaces of dim / M channels,
/// C codewords each, k-means with `iterations` Lloyd steps. Returns the codebooks as
/// [M][C][dim / M] floats. Throws Error when M does not divide dim, C is outside [1, 256], or the
/// codebook is larger than the points (C > n: k-means needs a distinct point per codeword).
inline std::vector<float> train(const float* points, std::int64_t n, int dim, int M, int C, int iterations = 8, std::uint64_t seed = 1) {
  KVD_EXPECT(dim >= 1, "pq::train: dimension is {}; expected at least 1", dim);
  KVD_EXPECT(M >= 1 && dim % M == 0, "pq::train: {} subspaces do not divide dimension {}", M, dim);
  KVD_EXPECT(C >= 1 && C <= kMaxCodewords, "pq::train: {} codewords per subspace; expected 1 to {}", C, kMaxCodewords);
  KVD_EXPECT(C <= n, "pq::train: codebook of {} codewords is larger than the {} training points; expected C <= points", C, n);
  KVD_EXPECT(iterations >= 0, "pq::train: iterations is {}; expected at least 0", iterations);
  return detail::train_unchecked(points, n, dim, M, C, iterations, seed);
}

/// codes[m] = the nearest codeword of subspace m to x (ties to the lower codeword), for a
/// codebook [M][C][dim / M] as pq::train returns.
inline void encode(const float* codebook, const float* x, int dim, int M, int C, std::uint8_t* codes) {
  const std::vector<float> cwt = detail::transpose_codebook(codebook, dim, M, C);
  detail::Encoder(cwt.data(), dim, M, C).encode(x, codes);
}

}  // namespace pq

}  // namespace kvdrive::index
