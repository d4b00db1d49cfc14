// index::ProductQuant, after PQCache (Zhang et al., 2025): product quantisation of keys and
// top-k on the approximate q . k computed from the codes.
//
// Page-level adaptation: the vectors quantised are the pages' mean keys (PQCache quantises every
// token's key). head_dim is split into M contiguous subspaces of head_dim / M channels; each has
// a codebook of C codewords (C <= 256, so a code is one byte) trained by k-means (Lloyd; initial
// codewords a seeded sample of distinct training points). A page is stored as its M codes. A
// query head's estimate for a page is by asymmetric distance computation (ADC): per select and
// head a table LUT[m][c] = q_m . codeword[m][c] (M x C floats), then
//     estimate = sum_m LUT[m][code[page][m]]  (pq_page_score),
// which is q . (the page mean's reconstruction). Pages are ranked by the GQA rule (Decision 4).
//
// Growth (the manager prefills in chunks of 32 pages, then appends page by page): until the
// codebooks are trained, pages are kept as exact means in a pending RowStore and scored exactly
// (q . mean, as MeanKey). As soon as the index holds T = max(train_pages, C) pages (or build()
// receives that many at once) it trains on T of them (all when it holds exactly T; otherwise
// T evenly spaced ones, which bounds the cost when build() gets a long prefill at once), encodes
// every page it holds and drops the pending means; later pages are encoded with the frozen
// codebooks. Training on T >= C points means a codebook is never larger than its training set;
// pq::train, the public training function, rejects C > n with an Error.
//
// Stored: per page M bytes of codes (exception to "index data in the KV dtype": codes are
// indices, not values), head_dim KV-dtype elements per page while untrained; per stream, once
// trained, the codebooks: C x head_dim elements in the KV dtype (64 KiB with C=256, head_dim 128,
// f16), channel-major (row m * head_dim / M + j holds channel j of subspace m for all C
// codewords) so that encoding and the lookup tables stream them. All of it is counted in
// bytes(). With the defaults (M=16, C=256) a 32K-token stream of 4096 pages at head_dim 128,
// f16, costs 64 KiB + 64 KiB: 4 bytes per token, against MeanKey's 32. The means are rounded to
// the KV dtype before they are trained on or encoded, and codes are chosen against the
// codebooks as stored (rounded).
//
// Cost: training is k-means on T points, about T x C x head_dim x iterations multiply-adds (once
// per stream, ~65 ms at the defaults on one core); encoding a page C x head_dim; select builds
// the tables (C x head_dim per head) and then reads M bytes per page.
//
// M must divide head_dim. The policy checks M and C when it is constructed; head_dim is known
// only at build(), which must not throw (the manager calls it after its point of no return), so
// check(head_dim) throws for a caller that can check early, and build() with an M that does not
// divide head_dim uses the largest divisor of head_dim below M instead (State::subspaces).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string_view>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/host_device.hpp"
#include "kvdrive/core/random.hpp"
#include "kvdrive/index/code_store.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/page_summary.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

/// ADC estimate of one page: sum over the M subspaces of lut[m * C + codes[m]], with
/// lut[m * C + c] = q_m . codeword[m][c].
KVD_HOST_DEVICE float pq_page_score(const float* lut, const std::uint8_t* codes, int M, int C) {
  float part[4] = {0, 0, 0, 0};
  for (int m = 0; m < M; ++m) part[m & 3] += lut[m * C + codes[m]];
  return (part[0] + part[2]) + (part[1] + part[3]);
}

namespace detail {
/// ADC estimates of n pages for G heads (G fixed: the accumulators stay in registers) from a
/// head-interleaved table lut_g[(m * C + c) * G + h] = LUT_h[m * C + c]: each code is read once
/// for all heads. Same additions in the same order as pq_page_score, so the same results.
template <int G>
inline void pq_rows_fixed(const float* lut_g, const std::uint8_t* codes, std::int64_t n, int M, int C, float* est,
                          std::size_t stride) {
  auto row = [&](const std::uint8_t* code, int m) { return lut_g + (static_cast<std::size_t>(m) * C + code[m]) * G; };
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* code = codes + static_cast<std::size_t>(i) * M;
    float p0[G] = {}, p1[G] = {}, p2[G] = {}, p3[G] = {};  // part[m & 3], kept in registers
    int m = 0;
    for (; m + 4 <= M; m += 4) {
      const float *r0 = row(code, m), *r1 = row(code, m + 1), *r2 = row(code, m + 2), *r3 = row(code, m + 3);
      for (int h = 0; h < G; ++h) {
        p0[h] += r0[h];
        p1[h] += r1[h];
        p2[h] += r2[h];
        p3[h] += r3[h];
      }
    }
    if (m < M)
      for (int h = 0; h < G; ++h) p0[h] += row(code, m)[h];
    if (m + 1 < M)
      for (int h = 0; h < G; ++h) p1[h] += row(code, m + 1)[h];
    if (m + 2 < M)
      for (int h = 0; h < G; ++h) p2[h] += row(code, m + 2)[h];
    for (int h = 0; h < G; ++h)
      est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] = (p0[h] + p2[h]) + (p1[h] + p3[h]);
  }
}
#if KVD_CPU_AVX2
/// pq_rows_fixed for 4 or 8 heads with the heads in one SSE / AVX register (compilers leave the
/// plain loop scalar).
template <int G>
struct Lanes;
template <>
struct Lanes<4> {
  using V = __m128;
  static V zero() { return _mm_setzero_ps(); }
  static V load(const float* p) { return _mm_loadu_ps(p); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static void store(float* p, V a) { _mm_storeu_ps(p, a); }
};
template <>
struct Lanes<8> {
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V a) { _mm256_storeu_ps(p, a); }
};

template <int G>
inline void pq_rows_simd(const float* lut_g, const std::uint8_t* codes, std::int64_t n, int M, int C, float* est,
                         std::size_t stride) {
  using L = Lanes<G>;
  using V = typename L::V;
  auto load = [&](const std::uint8_t* code, int m) { return L::load(lut_g + (static_cast<std::size_t>(m) * C + code[m]) * G); };
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* code = codes + static_cast<std::size_t>(i) * M;
    V p0 = L::zero(), p1 = L::zero(), p2 = L::zero(), p3 = L::zero();  // part[m & 3], a lane per head
    int m = 0;
    for (; m + 4 <= M; m += 4) {
      p0 = L::add(p0, load(code, m));
      p1 = L::add(p1, load(code, m + 1));
      p2 = L::add(p2, load(code, m + 2));
      p3 = L::add(p3, load(code, m + 3));
    }
    if (m < M) p0 = L::add(p0, load(code, m));
    if (m + 1 < M) p1 = L::add(p1, load(code, m + 1));
    if (m + 2 < M) p2 = L::add(p2, load(code, m + 2));
    float sum[G];
    L::store(sum, L::add(L::add(p0, p2), L::add(p1, p3)));
    for (int h = 0; h < G; ++h) est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] = sum[h];
  }
}
#endif
}  // namespace detail

/// est[h * stride + i] = pq_page_score for head h and page i, for n contiguous page codes [n][M];
/// lut_g is head-interleaved: lut_g[(m * C + c) * group + h].
inline void pq_rows(const float* lut_g, int group, const std::uint8_t* codes, std::int64_t n, int M, int C, float* est,
                    std::size_t stride) {
  switch (group) {
    case 1: return detail::pq_rows_fixed<1>(lut_g, codes, n, M, C, est, stride);
    case 2: return detail::pq_rows_fixed<2>(lut_g, codes, n, M, C, est, stride);
#if KVD_CPU_AVX2
    case 4: return detail::pq_rows_simd<4>(lut_g, codes, n, M, C, est, stride);
    case 8: return detail::pq_rows_simd<8>(lut_g, codes, n, M, C, est, stride);
#else
    case 4: return detail::pq_rows_fixed<4>(lut_g, codes, n, M, C, est, stride);
    case 8: return detail::pq_rows_fixed<8>(lut_g, codes, n, M, C, est, stride);
#endif
    default: break;
  }
  thread_local std::vector<float> lut;  // other group sizes: de-interleave, pq_page_score per head
  const std::size_t mc = static_cast<std::size_t>(M) * C;
  lut.resize(mc);
  for (int h = 0; h < group; ++h) {
    for (std::size_t j = 0; j < mc; ++j) lut[j] = lut_g[j * group + h];
    for (std::int64_t i = 0; i < n; ++i)
      est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] =
          pq_page_score(lut.data(), codes + static_cast<std::size_t>(i) * M, M, C);
  }
}

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
      for (std::size_t j = 0; j < s; ++j) cwt[j * static_cast<std::size_t>(C) + static_cast<std::size_t>(c)] = cw[static_cast<std::size_t>(c) * s + j];
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
      for (int c = 0; c < C; ++c)
        cwt[(static_cast<std::size_t>(m) * sub + j) * C + c] = codebook[(static_cast<std::size_t>(m) * C + c) * sub + j];
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
      codes[m] = static_cast<std::uint8_t>(nearest(cwt_ + static_cast<std::size_t>(m) * sub_ * C_, C_,
                                                   x + static_cast<std::size_t>(m) * sub_, sub_, dist_.data()));
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
inline std::vector<float> train_unchecked(const float* points, std::int64_t n, int dim, int M, int C, int iterations,
                                          std::uint64_t seed) {
  const int sub = dim / M;
  std::vector<float> book(static_cast<std::size_t>(C) * static_cast<std::size_t>(dim));
  std::vector<float> x(static_cast<std::size_t>(n) * static_cast<std::size_t>(sub));
  for (int m = 0; m < M; ++m) {
    for (std::int64_t i = 0; i < n; ++i)
      std::copy_n(points + static_cast<std::size_t>(i) * dim + static_cast<std::size_t>(m) * sub, sub,
                  x.data() + static_cast<std::size_t>(i) * sub);
    kmeans(x.data(), n, sub, C, iterations, seed + static_cast<std::uint64_t>(m),
           book.data() + static_cast<std::size_t>(m) * C * sub);
  }
  return book;
}

}  // namespace detail

/// Trains product-quantisation codebooks on n points [n][dim]: M subspaces of dim / M channels,
/// C codewords each, k-means with `iterations` Lloyd steps. Returns the codebooks as
/// [M][C][dim / M] floats. Throws Error when M does not divide dim, C is outside [1, 256], or the
/// codebook is larger than the points (C > n: k-means needs a distinct point per codeword).
inline std::vector<float> train(const float* points, std::int64_t n, int dim, int M, int C, int iterations = 8,
                                std::uint64_t seed = 1) {
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

class ProductQuant {
 public:
  struct Params {
    int M = 16;                        ///< subspaces; must divide head_dim; in [1, 1024]
    int C = 256;                       ///< codewords per subspace, in [1, 256]
    std::int64_t train_pages = 1024;   ///< pages trained on (at least C are used)
    int iterations = 8;                ///< Lloyd iterations, in [0, 1000]
    std::uint64_t seed = 1;            ///< the initial codewords' seed
  };

  struct State {
    RowStore pending;                   ///< exact means [head_dim] (KV dtype) until trained
    RowStore codebook;                  ///< once trained: head_dim rows of C (KV dtype), row
                                        ///< m * (head_dim / M) + j = channel j of subspace m's codewords
    CodeStore<std::uint8_t> codes;      ///< M bytes per page once trained
    std::int64_t pages = 0;
    int head_dim = 0;
    int subspaces = 0;                  ///< M as used (see check())
    DType dtype = DType::f32;

    bool trained() const { return codebook.rows() > 0; }
  };

  ProductQuant() : ProductQuant(Params{}) {}
  explicit ProductQuant(Params p) : params_(p) {
    KVD_EXPECT(p.M >= 1 && p.M <= 1024, "ProductQuant: M (subspaces) is {}; expected 1 to 1024, dividing head_dim", p.M);
    KVD_EXPECT(p.C >= 1 && p.C <= pq::kMaxCodewords, "ProductQuant: C (codewords per subspace) is {}; expected 1 to {} (one-byte codes)",
               p.C, pq::kMaxCodewords);
    KVD_EXPECT(p.train_pages >= 1, "ProductQuant: train_pages is {}; expected at least 1", p.train_pages);
    KVD_EXPECT(p.iterations >= 0 && p.iterations <= 1000, "ProductQuant: iterations is {}; expected 0 to 1000", p.iterations);
  }

  static constexpr std::string_view name() { return "product-quant"; }
  const Params& params() const { return params_; }
  /// Pages the index holds when it trains: max(train_pages, C).
  std::int64_t train_threshold() const { return std::max<std::int64_t>(params_.train_pages, params_.C); }

  /// Throws Error unless M divides head_dim. build() never throws: with such an M it uses the
  /// largest divisor of head_dim below M.
  void check(int head_dim) const {
    KVD_EXPECT(head_dim >= 1 && head_dim % params_.M == 0, "ProductQuant: M = {} subspaces do not divide head_dim {}",
               params_.M, head_dim);
  }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (k.pages <= 0 || k.head_dim <= 0) return;
    if (s.head_dim == 0) init(s, k.head_dim, k.dtype);
    const auto d = static_cast<std::size_t>(k.head_dim);
    std::vector<float> mean(d);
    if (s.trained()) {
      const std::vector<float> cwt = codebook_transposed(s);
      pq::detail::Encoder enc(cwt.data(), s.head_dim, s.subspaces, params_.C);
      std::vector<std::uint8_t> code(static_cast<std::size_t>(s.subspaces));
      for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) {
        page_mean(k, p, mean.data());
        round_to_dtype(s.dtype, mean.data(), d);
        enc.encode(mean.data(), code.data());
        s.codes.push(code.data());
      }
      return;
    }
    for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) {
      page_mean(k, p, mean.data());
      s.pending.push(mean.data());
    }
    if (!s.trained() && s.pages >= train_threshold()) train(s);
  }

  std::size_t bytes(const State& s) const { return s.pending.bytes() + s.codebook.bytes() + s.codes.bytes(); }

  /// The codebooks as float [M][C][head_dim / M] (as stored, in the KV dtype's precision).
  std::vector<float> codebook_float(const State& s) const {
    const std::vector<float> cwt = codebook_transposed(s);
    const int M = s.subspaces, C = params_.C, sub = s.head_dim / std::max(M, 1);
    std::vector<float> book(cwt.size());
    for (int m = 0; m < M && s.trained(); ++m)
      for (int c = 0; c < C; ++c)
        for (int j = 0; j < sub; ++j)
          book[(static_cast<std::size_t>(m) * C + c) * sub + j] = cwt[(static_cast<std::size_t>(m) * sub + j) * C + c];
    return book;
  }

  /// The codebooks as stored, as float: cwt[m][j][c] (head_dim rows of C).
  std::vector<float> codebook_transposed(const State& s) const {
    std::vector<float> cwt(static_cast<std::size_t>(s.codebook.rows()) * s.codebook.width());
    dispatch_dtype(s.codebook.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      s.codebook.for_runs<T>(0, s.codebook.rows(), [&](std::int64_t first, std::int64_t count, const T* rows) {
        pq::detail::to_float_n(rows, static_cast<std::size_t>(count) * s.codebook.width(),
                               cwt.data() + static_cast<std::size_t>(first) * s.codebook.width());
      });
    });
    return cwt;
  }

  /// est[h * candidates + i]: head h's estimate for candidate page first_candidate + i.
  void estimate(const State& s, const IndexQuery& q, float* est) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    if (n == 0) return;
    if (!s.trained()) {  // exact means, as MeanKey
      dispatch_dtype(s.pending.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        s.pending.for_runs<T>(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const T* rows) {
          dot_rows(q.q, q.group, rows, count, q.head_dim, est + (first - q.first_candidate), n);
        });
      });
      return;
    }
    const int M = s.subspaces, C = params_.C, sub = s.head_dim / M, group = q.group;
    const auto mc = static_cast<std::size_t>(M) * C;
    // lut_g[(m * C + c) * group + h] = q_h,m . codeword[m][c]: per channel row (C codewords'
    // values), an axpy per head; head-interleaved so the page loop reads each code once.
    thread_local std::vector<float> lut, row;
    lut.assign(static_cast<std::size_t>(group) * mc, 0.0f);
    row.resize(static_cast<std::size_t>(C));
    dispatch_dtype(s.codebook.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (int r = 0; r < s.head_dim; ++r) {
        pq::detail::to_float_n(s.codebook.row<T>(r), static_cast<std::size_t>(C), row.data());
        const int m = r / sub;
        for (int h = 0; h < group; ++h) {
          const float qv = q.q[static_cast<std::size_t>(h) * q.head_dim + static_cast<std::size_t>(r)];
          float* l = lut.data() + static_cast<std::size_t>(h) * mc + static_cast<std::size_t>(m) * C;
          for (int c = 0; c < C; ++c) l[c] += qv * row[static_cast<std::size_t>(c)];
        }
      }
    });
    thread_local std::vector<float> lut_g;
    lut_g.resize(lut.size());
    for (std::size_t j = 0; j < mc; ++j)
      for (int h = 0; h < group; ++h) lut_g[j * group + h] = lut[static_cast<std::size_t>(h) * mc + j];
    s.codes.for_runs(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const std::uint8_t* rows) {
      pq_rows(lut_g.data(), group, rows, count, M, C, est + (first - q.first_candidate), n);
    });
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    select_by_estimates(q, out, [&](float* est) { estimate(s, q, est); });
  }

 private:
  void init(State& s, int head_dim, DType dtype) const {
    s.head_dim = head_dim;
    s.dtype = dtype;
    int m = std::min(params_.M, head_dim);
    while (head_dim % m != 0) --m;  // m = 1 always divides
    s.subspaces = m;
    s.pending = RowStore(static_cast<std::size_t>(head_dim), dtype);
  }

  /// Trains on T = train_threshold() of the pending means (evenly spaced), encodes all of them
  /// and drops them.
  void train(State& s) const {
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::int64_t held = s.pending.rows(), take = train_threshold();
    std::vector<float> points(static_cast<std::size_t>(take) * d);
    for (std::int64_t i = 0; i < take; ++i)
      s.pending.row_float(i * held / take, points.data() + static_cast<std::size_t>(i) * d);
    const int M = s.subspaces, C = params_.C;
    const std::vector<float> book = pq::detail::train_unchecked(points.data(), take, s.head_dim, M, C, params_.iterations, params_.seed);
    const std::vector<float> rows = pq::detail::transpose_codebook(book.data(), s.head_dim, M, C);
    s.codebook = RowStore(static_cast<std::size_t>(C), s.dtype, s.head_dim);  // exactly head_dim rows
    for (int r = 0; r < s.head_dim; ++r) s.codebook.push(rows.data() + static_cast<std::size_t>(r) * C);
    s.codes = CodeStore<std::uint8_t>(static_cast<std::size_t>(M));
    const std::vector<float> cwt = codebook_transposed(s);  // encode against the codebooks as stored (rounded)
    pq::detail::Encoder enc(cwt.data(), s.head_dim, M, C);
    std::vector<float> mean(d);
    std::vector<std::uint8_t> code(static_cast<std::size_t>(M));
    for (std::int64_t p = 0; p < held; ++p) {
      s.pending.row_float(p, mean.data());
      enc.encode(mean.data(), code.data());
      s.codes.push(code.data());
    }
    s.pending = RowStore(d, s.dtype);
  }

  Params params_;
};
static_assert(IndexPolicy<ProductQuant>);

}  // namespace kvdrive::index
