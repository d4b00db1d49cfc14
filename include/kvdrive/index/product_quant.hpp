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
// Interim codebooks (so that the index is product quantisation at every size, not MeanKey below
// T): from first_train_pages pages (128, 1K tokens at 8 tokens per page) until T, it trains an
// interim codebook each time the pages it holds double (128, 256, 512, ...), on all of them, with
// min(C, pages / 4) codewords (four means per codeword on average, T / C at the defaults), and
// scores through it; the exact means stay pending (and counted in bytes()) for the next training.
// The training at T is the one above, on exact means, so from T pages on the index is the same,
// bit for bit, as without interim codebooks. Cost: the interim trainings add about a third to the
// final one's. first_train_pages = 0, or >= T, turns them off.
//
// Stored: per page M bytes of codes (exception to "index data in the KV dtype": codes are
// indices, not values), head_dim KV-dtype elements per page until the final training; per stream,
// once trained, the codebooks: C x head_dim elements in the KV dtype (64 KiB with C=256, head_dim 128,
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
//
// Where the parts live: training, the codebook layout and encoding in pq_codebook.hpp (namespace
// pq); the ADC page scores (pq_page_score, pq_rows) in pq_scoring.hpp; the policy here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/index/code_store.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/page_summary.hpp"
#include "kvdrive/index/pq_codebook.hpp"
#include "kvdrive/index/pq_scoring.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

class ProductQuant {
 public:
  struct Params {
    int M = 16;                            ///< subspaces; must divide head_dim; in [1, 1024]
    int C = 256;                           ///< codewords per subspace, in [1, 256]
    std::int64_t train_pages = 1024;       ///< pages trained on (at least C are used)
    std::int64_t first_train_pages = 128;  ///< the first interim codebook's pages (0: none)
    int iterations = 8;                    ///< Lloyd iterations, in [0, 1000]
    std::uint64_t seed = 1;                ///< the initial codewords' seed
  };

  struct State {
    RowStore pending;               ///< exact means [head_dim] (KV dtype) until the final training
    RowStore codebook;              ///< once trained: head_dim rows of `codewords` (KV dtype), row
                                    ///< m * (head_dim / M) + j = channel j of subspace m's codewords
    CodeStore<std::uint8_t> codes;  ///< M bytes per page once trained
    std::int64_t pages = 0;
    std::int64_t trained_at = 0;  ///< pages held at the last training (0: none yet)
    int head_dim = 0;
    int subspaces = 0;  ///< M as used (see check())
    int codewords = 0;  ///< C of the codebook in use
    DType dtype = DType::f32;

    /// Scored through a codebook (interim or final).
    bool trained() const { return codebook.rows() > 0; }
    /// Trained on T pages: the codebooks are frozen and the exact means dropped.
    bool frozen() const { return trained() && pending.rows() == 0; }
  };

  ProductQuant() : ProductQuant(Params{}) {}
  explicit ProductQuant(Params p) : params_(p) {
    KVD_EXPECT(p.M >= 1 && p.M <= 1024, "ProductQuant: M (subspaces) is {}; expected 1 to 1024, dividing head_dim", p.M);
    KVD_EXPECT(p.C >= 1 && p.C <= pq::kMaxCodewords, "ProductQuant: C (codewords per subspace) is {}; expected 1 to {} (one-byte codes)", p.C,
               pq::kMaxCodewords);
    KVD_EXPECT(p.train_pages >= 1, "ProductQuant: train_pages is {}; expected at least 1", p.train_pages);
    KVD_EXPECT(p.first_train_pages >= 0, "ProductQuant: first_train_pages is {}; expected at least 0", p.first_train_pages);
    KVD_EXPECT(p.iterations >= 0 && p.iterations <= 1000, "ProductQuant: iterations is {}; expected 0 to 1000", p.iterations);
  }

  static constexpr std::string_view name() { return "product-quant"; }
  const Params& params() const { return params_; }
  /// Pages the index holds when it trains its final codebooks: max(train_pages, C).
  std::int64_t train_threshold() const { return std::max<std::int64_t>(params_.train_pages, params_.C); }
  /// Pages the index must hold for its next training, given the pages of the last one (0: none).
  std::int64_t next_training(std::int64_t trained_at) const {
    const std::int64_t final_at = train_threshold(), first = params_.first_train_pages;
    if (first <= 0 || first >= final_at) return final_at;
    return trained_at == 0 ? first : std::min(2 * trained_at, final_at);
  }
  /// Codewords per subspace of a training on `points` pages: C for the final one, else
  /// min(C, points / 4), at least 1.
  int codewords_for(std::int64_t points) const {
    if (points >= train_threshold()) return params_.C;
    return static_cast<int>(std::clamp<std::int64_t>(points / kPointsPerCodeword, 1, params_.C));
  }
  static constexpr std::int64_t kPointsPerCodeword = 4;

  /// Throws Error unless M divides head_dim. build() never throws: with such an M it uses the
  /// largest divisor of head_dim below M.
  void check(int head_dim) const {
    KVD_EXPECT(head_dim >= 1 && head_dim % params_.M == 0, "ProductQuant: M = {} subspaces do not divide head_dim {}", params_.M, head_dim);
  }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (k.pages <= 0 || k.head_dim <= 0) return;
    if (s.head_dim == 0) init(s, k.head_dim, k.dtype);
    const auto d = static_cast<std::size_t>(k.head_dim);
    std::vector<float> mean(d);
    std::vector<std::uint8_t> code(static_cast<std::size_t>(s.subspaces));
    const std::vector<float> cwt = codebook_transposed(s);  // empty until trained
    std::optional<pq::detail::Encoder> enc;
    if (s.trained()) enc.emplace(cwt.data(), s.head_dim, s.subspaces, s.codewords);
    for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) {
      page_mean(k, p, mean.data());
      if (!s.frozen()) s.pending.push(mean.data());  // kept for the next training
      if (!enc) continue;
      round_to_dtype(s.dtype, mean.data(), d);
      enc->encode(mean.data(), code.data());
      s.codes.push(code.data());
    }
    if (!s.frozen() && s.pages >= next_training(s.trained_at)) train(s);
  }

  std::size_t bytes(const State& s) const { return s.pending.bytes() + s.codebook.bytes() + s.codes.bytes(); }

  /// The codebooks as float [M][C][head_dim / M] (as stored, in the KV dtype's precision).
  std::vector<float> codebook_float(const State& s) const {
    const std::vector<float> cwt = codebook_transposed(s);
    const int M = s.subspaces, C = s.codewords, sub = s.head_dim / std::max(M, 1);
    std::vector<float> book(cwt.size());
    for (int m = 0; m < M && s.trained(); ++m)
      for (int c = 0; c < C; ++c)
        for (int j = 0; j < sub; ++j) book[(static_cast<std::size_t>(m) * C + c) * sub + j] = cwt[(static_cast<std::size_t>(m) * sub + j) * C + c];
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
    const int M = s.subspaces, C = s.codewords, sub = s.head_dim / M, group = q.group;
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

  /// Trains on the pending means: the final codebooks on T = train_threshold() of them (evenly
  /// spaced) once the index holds T pages, then drops them; before that an interim codebook on all
  /// of them. Encodes every page held.
  void train(State& s) const {
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::int64_t held = s.pending.rows();
    const bool final = held >= train_threshold();
    const std::int64_t take = final ? train_threshold() : held;
    std::vector<float> points(static_cast<std::size_t>(take) * d);
    for (std::int64_t i = 0; i < take; ++i) s.pending.row_float(i * held / take, points.data() + static_cast<std::size_t>(i) * d);
    const int M = s.subspaces, C = codewords_for(take);
    const std::vector<float> book = pq::detail::train_unchecked(points.data(), take, s.head_dim, M, C, params_.iterations, params_.seed);
    const std::vector<float> rows = pq::detail::transpose_codebook(book.data(), s.head_dim, M, C);
    s.codebook = RowStore(static_cast<std::size_t>(C), s.dtype, s.head_dim);  // exactly head_dim rows
    for (int r = 0; r < s.head_dim; ++r) s.codebook.push(rows.data() + static_cast<std::size_t>(r) * C);
    s.codewords = C;
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
    s.trained_at = held;
    if (final) s.pending = RowStore(d, s.dtype);
  }

  Params params_;
};
static_assert(IndexPolicy<ProductQuant>);

}  // namespace kvdrive::index
