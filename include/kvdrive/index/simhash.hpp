// index::SimHash, after MagicPIG (Chen et al., 2024): random-hyperplane LSH, K bits per table x
// L tables (MagicPIG's K=10, L=150 by default). Bit j of a vector's code is sign(r_j . x) for a
// fixed Gaussian hyperplane r_j; two vectors at angle theta differ in each bit with probability
// theta / pi, so the Hamming distance h over B = K*L bits estimates the angle.
//
// Page-level adaptation. MagicPIG hashes every token, samples the tokens that collide with the
// query in at least two whole tables and corrects with an importance-sampling estimator. Here the
// unit is a page: each page is represented by its mean key, and a query head's estimate for a
// page is SimHash's estimate of q . mean,
//     |q| |mean| cos(pi h / B),   h = differing bits over all B = K*L bits.
// Counting differing bits over all tables rather than whole-table collisions gives a graded
// score (B + 1 levels instead of "collides in >= 2 tables or not"), which a top-k needs; K and L
// then matter only through B (bit j of table l is bit l*K + j of the packed code). Pages are
// ranked by the GQA rule (Decision 4).
//
// Stored, per page: the B sign bits packed in ceil(B / 64) 64-bit words (documented exception to
// "index data in the KV dtype": they are bits, not values) and |mean| in the KV dtype. With the
// defaults, 24 words: 192 bytes + 2 (f16) per page, against MeanKey's 256 at head_dim 128.
// Per stream: the B hyperplanes, B x head_dim in the KV dtype (1500 x 128 x 2 = 375 KiB with the
// defaults), generated from the seed when the state first sees head_dim; every stream with the
// same seed, head_dim and dtype holds the same planes (a copy per stream, as asked of every
// index's State; sharing them per model would take the per-stream cost to the bits and norms
// alone). All of it is counted in bytes().
//
// Cost: hashing a page or a query head is B x head_dim multiply-adds (AVX2 via dot_rows); select
// hashes the group's heads once, then counts differing bits per page and head over ceil(B / 64)
// words (AVX2 nibble-table popcount where the compiler targets it).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
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

KVD_HOST_DEVICE int popcount64(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return std::popcount(x);
#endif
}

/// Hamming distance between two sign codes of `words` 64-bit words (unused trailing bits must be
/// equal in both: the index keeps them zero).
KVD_HOST_DEVICE int simhash_hamming(const std::uint64_t* a, const std::uint64_t* b, int words) {
  int n[4] = {0, 0, 0, 0};  // independent sums: popcounts overlap instead of queueing on one add
  int w = 0;
  for (; w + 4 <= words; w += 4)
    for (int u = 0; u < 4; ++u) n[u] += popcount64(a[w + u] ^ b[w + u]);
  for (; w < words; ++w) n[0] += popcount64(a[w] ^ b[w]);
  return (n[0] + n[1]) + (n[2] + n[3]);
}

/// SimHash's estimate of q . x from the norms and the Hamming distance of the codes:
/// q_norm x_norm cos(pi hamming / B), with cos_table[h] = cos(pi h / B) for h in [0, B].
KVD_HOST_DEVICE float simhash_estimate(float q_norm, float x_norm, int hamming, const float* cos_table) {
  return q_norm * x_norm * cos_table[hamming];
}

#if KVD_CPU_AVX2
namespace detail {
/// Hamming distances of one page's code to `group` query codes (AVX2: nibble-table popcount,
/// Mula et al., on four words at a time, the page's words loaded once for all heads).
inline void simhash_page_avx2(const std::uint64_t* page, const std::uint64_t* qcodes, int group, int words, int* ham) {
  const __m256i table = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,  //
                                         0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i zero = _mm256_setzero_si256();
  const int full = words / 4 * 4;
  for (int h0 = 0; h0 < group; h0 += 4) {
    const int hb = group - h0 < 4 ? group - h0 : 4;
    __m256i bytes[4], sums[4];
    for (int h = 0; h < 4; ++h) bytes[h] = sums[h] = zero;
    for (int w = 0; w < full; w += 4) {
      const __m256i pv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(page + w));
      for (int h = 0; h < hb; ++h) {
        const __m256i v =
            _mm256_xor_si256(pv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qcodes + static_cast<std::size_t>(h0 + h) * words + w)));
        const __m256i c = _mm256_add_epi8(_mm256_shuffle_epi8(table, _mm256_and_si256(v, low)),
                                          _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low)));
        bytes[h] = _mm256_add_epi8(bytes[h], c);
      }
      if ((w / 4) % 31 == 30) {  // a byte holds at most 31 x 8 = 248 before it is widened
        for (int h = 0; h < hb; ++h) {
          sums[h] = _mm256_add_epi64(sums[h], _mm256_sad_epu8(bytes[h], zero));
          bytes[h] = zero;
        }
      }
    }
    for (int h = 0; h < hb; ++h) {
      const __m256i t = _mm256_add_epi64(sums[h], _mm256_sad_epu8(bytes[h], zero));
      const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
      int n = static_cast<int>(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1));
      for (int w = full; w < words; ++w) n += popcount64(page[w] ^ qcodes[static_cast<std::size_t>(h0 + h) * words + w]);
      ham[h0 + h] = n;
    }
  }
}
}  // namespace detail
#endif

/// ham[h * stride + i] = Hamming distance of page i's code to query code h, for n contiguous
/// page codes [n][words] and the group's codes [group][words]. The CPU loop over
/// simhash_hamming (AVX2 where the compiler targets it; integer counts, so both agree exactly).
inline void simhash_rows(const std::uint64_t* pages, std::int64_t n, const std::uint64_t* qcodes, int group, int words, int* ham,
                         std::size_t stride) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t* page = pages + static_cast<std::size_t>(i) * words;
#if KVD_CPU_AVX2
    int h_of[64];
    if (group <= 64) {
      detail::simhash_page_avx2(page, qcodes, group, words, h_of);
      for (int h = 0; h < group; ++h) ham[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] = h_of[h];
      continue;
    }
#endif
    for (int h = 0; h < group; ++h)
      ham[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] =
          simhash_hamming(page, qcodes + static_cast<std::size_t>(h) * words, words);
  }
}

class SimHash {
 public:
  struct Params {
    int K = 10;                               ///< bits per table, in [1, 64] (a table's key fits one word)
    int L = 150;                              ///< tables, in [1, 1024] (at most 8 KiB of bits per page)
    std::uint64_t seed = 0x5eed5147a5b17ull;  ///< the hyperplanes' seed
  };

  struct State {
    RowStore planes;                 ///< B rows of head_dim, in the KV dtype
    CodeStore<std::uint64_t> codes;  ///< words() per page: the mean key's sign bits
    RowStore norms;                  ///< one element per page: |mean|, in the KV dtype
    std::int64_t pages = 0;
    int head_dim = 0;
  };

  SimHash() : SimHash(Params{}) {}
  explicit SimHash(Params p) : params_(p) {
    KVD_EXPECT(p.K >= 1 && p.K <= 64, "SimHash: K (bits per table) is {}; expected 1 to 64", p.K);
    KVD_EXPECT(p.L >= 1 && p.L <= 1024, "SimHash: L (tables) is {}; expected 1 to 1024", p.L);
    const int b = bits();
    cos_table_.resize(static_cast<std::size_t>(b) + 1);
    for (int h = 0; h <= b; ++h)
      cos_table_[static_cast<std::size_t>(h)] = static_cast<float>(std::cos(std::numbers::pi * static_cast<double>(h) / static_cast<double>(b)));
  }

  static constexpr std::string_view name() { return "simhash"; }
  const Params& params() const { return params_; }
  /// B = K * L, the bits per code.
  int bits() const { return params_.K * params_.L; }
  /// 64-bit words per code.
  int words() const { return (bits() + 63) / 64; }
  /// cos(pi h / B) for h in [0, B]: simhash_estimate's table.
  const float* cos_table() const { return cos_table_.data(); }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (k.pages <= 0 || k.head_dim <= 0) return;
    if (s.head_dim == 0) init(s, k.head_dim, k.dtype);
    const auto d = static_cast<std::size_t>(k.head_dim);
    const auto w = static_cast<std::size_t>(words());
    constexpr std::int64_t kChunk = 64;  // pages hashed per pass over the planes
    std::vector<float> means(static_cast<std::size_t>(kChunk) * d);
    std::vector<std::uint64_t> code(static_cast<std::size_t>(kChunk) * w);
    for (std::int64_t p0 = 0; p0 < k.pages; p0 += kChunk) {
      const std::int64_t n = std::min(kChunk, k.pages - p0);
      for (std::int64_t i = 0; i < n; ++i) {
        float* m = means.data() + static_cast<std::size_t>(i) * d;
        page_mean(k, p0 + i, m);
        float sq = 0.0f;
        for (std::size_t j = 0; j < d; ++j) sq += m[j] * m[j];
        const float norm = std::sqrt(sq);
        s.norms.push(&norm);
      }
      hash(s, means.data(), static_cast<int>(n), code.data());
      for (std::int64_t i = 0; i < n; ++i) s.codes.push(code.data() + static_cast<std::size_t>(i) * w);
      s.pages += n;
    }
  }

  std::size_t bytes(const State& s) const { return s.planes.bytes() + s.codes.bytes() + s.norms.bytes(); }

  /// codes[i][words()] = sign bits of x_i . plane_j for n vectors x [n][head_dim] (bit j % 64 of
  /// word j / 64 set when the product is > 0; trailing bits zero). The state must be built.
  void hash(const State& s, const float* x, int n, std::uint64_t* codes) const {
    const int b = bits(), w = words(), d = s.head_dim;
    thread_local std::vector<float> proj;
    proj.resize(static_cast<std::size_t>(n) * b);
    dispatch_dtype(s.planes.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      s.planes.for_runs<T>(0, b, [&](std::int64_t first, std::int64_t count, const T* rows) {
        dot_rows(x, n, rows, count, d, proj.data() + first, static_cast<std::size_t>(b));
      });
    });
    for (int i = 0; i < n; ++i) {
      const float* pr = proj.data() + static_cast<std::size_t>(i) * b;
      std::uint64_t* c = codes + static_cast<std::size_t>(i) * w;
      for (int j = 0; j < w; ++j) c[j] = 0;
      for (int j = 0; j < b; ++j) c[j >> 6] |= static_cast<std::uint64_t>(pr[j] > 0.0f) << (j & 63);
    }
  }

  /// est[h * candidates + i]: head h's estimate for candidate page first_candidate + i.
  void estimate(const State& s, const IndexQuery& q, float* est) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    if (n == 0) return;
    const int w = words(), group = q.group;
    thread_local std::vector<std::uint64_t> qcode;
    thread_local std::vector<float> qnorm;
    qcode.resize(static_cast<std::size_t>(group) * w);
    qnorm.resize(static_cast<std::size_t>(group));
    hash(s, q.q, group, qcode.data());
    for (int h = 0; h < group; ++h) {
      const float* qh = q.q + static_cast<std::size_t>(h) * q.head_dim;
      float sq = 0.0f;
      for (int j = 0; j < q.head_dim; ++j) sq += qh[j] * qh[j];
      qnorm[static_cast<std::size_t>(h)] = std::sqrt(sq);
    }
    thread_local std::vector<int> ham;
    ham.resize(static_cast<std::size_t>(group) * n);
    s.codes.for_runs(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const std::uint64_t* rows) {
      simhash_rows(rows, count, qcode.data(), group, w, ham.data() + (first - q.first_candidate), n);
    });
    const float* table = cos_table_.data();
    dispatch_dtype(s.norms.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      s.norms.for_runs<T>(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const T* norms) {
        const auto at = static_cast<std::size_t>(first - q.first_candidate);
        for (int h = 0; h < group; ++h) {
          const float qn = qnorm[static_cast<std::size_t>(h)];
          const int* hh = ham.data() + static_cast<std::size_t>(h) * n + at;
          float* e = est + static_cast<std::size_t>(h) * n + at;
          for (std::int64_t i = 0; i < count; ++i) e[i] = simhash_estimate(qn, to_float(norms[i]), hh[i], table);
        }
      });
    });
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    select_by_estimates(q, out, [&](float* est) { estimate(s, q, est); });
  }

 private:
  /// Generates the B hyperplanes (standard normal entries, seeded) in the KV dtype.
  void init(State& s, int head_dim, DType dtype) const {
    s.head_dim = head_dim;
    const auto d = static_cast<std::size_t>(head_dim);
    s.planes = RowStore(d, dtype, bits());  // exactly B rows
    s.codes = CodeStore<std::uint64_t>(static_cast<std::size_t>(words()));
    s.norms = RowStore(1, dtype);
    SplitMix64 rng(params_.seed);
    std::vector<float> row(d);
    for (int j = 0; j < bits(); ++j) {
      for (auto& x : row) x = static_cast<float>(rng.normal());
      s.planes.push(row.data());
    }
  }

  Params params_;
  std::vector<float> cos_table_;
};
static_assert(IndexPolicy<SimHash>);

}  // namespace kvdrive::index
