// Warm-up placement: at the end of prefill, decide which pages start in fast memory. A
// Placement scores every page of a stream from the prompt's last queries (the observation
// window) and ranks the index candidates best first; KvManager::warm_up admits the top of the
// ranking into the cache at step 0 (Decision 6), and the eval replays do the same. The storage
// tiers use the same ranking to put important pages on faster tiers (hook: `rank`).
//
// ImportanceGuided is SnapKV's rule: each observation query attends causally over the prefix;
// a token's importance is its attention weight summed over the group's heads and averaged over
// the observation queries; a max-pool over neighbouring tokens (SnapKV's clustering step) keeps
// whole phrases together. A page ranks by its pooled importance; its score (what eviction sees
// at step 0) is its plain importance, on the same scale as a decode step's page mass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::tier {

/// One stream at the end of prefill, as float.
struct PlacementInput {
  const float* keys = nullptr;  ///< [tokens][head_dim]: the prompt's keys (after RoPE)
  std::int64_t tokens = 0;
  const float* queries = nullptr;  ///< [observed][group][head_dim], positions tokens - observed .. tokens - 1
  std::int64_t observed = 0;
  int group = 1;
  int head_dim = 0;
  int page_tokens = 0;
  float scale = 0;  ///< the attention scale, 1/sqrt(head_dim)
};

/// A ranking of candidate pages, best first, and each one's score.
struct PageRanking {
  std::vector<std::uint32_t> pages;
  std::vector<float> scores;

  /// Throws unless every page is in [first, end), none twice, each with a finite score.
  void check(std::uint32_t first, std::uint32_t end, std::string_view who) const {
    KVD_EXPECT(scores.size() == pages.size(), "placement '{}': {} pages but {} scores", who, pages.size(), scores.size());
    std::vector<bool> seen(end > first ? end - first : 0, false);
    for (std::size_t i = 0; i < pages.size(); ++i) {
      KVD_EXPECT(pages[i] >= first && pages[i] < end, "placement '{}': page {} outside the candidates [{}, {})", who, pages[i], first, end);
      KVD_EXPECT(!seen[pages[i] - first], "placement '{}': page {} ranked twice", who, pages[i]);
      KVD_EXPECT(std::isfinite(scores[i]), "placement '{}': page {} has score {}", who, pages[i], scores[i]);
      seen[pages[i] - first] = true;
    }
  }
};

template <class P>
concept PlacementPolicy = requires(const P& p, const PlacementInput& in, std::uint32_t first, std::uint32_t end) {
  { P::name() } -> std::convertible_to<std::string_view>;
  { p.rank(in, first, end) } -> std::same_as<PageRanking>;
};

struct ImportanceGuided {
  int observation = 32;  ///< prompt queries that vote: SnapKV uses the last 16-64
  int pool_kernel = 7;   ///< width of the max-pool over tokens (odd; 1 = no pooling)

  static constexpr std::string_view name() { return "importance-guided"; }

  void validate() const {
    KVD_EXPECT(observation >= 1 && observation <= 1024, "ImportanceGuided: observation {} queries, expected 1..1024 (SnapKV: 16-64)", observation);
    KVD_EXPECT(pool_kernel >= 1 && pool_kernel % 2 == 1 && pool_kernel <= 255, "ImportanceGuided: pool_kernel {} must be odd, 1..255", pool_kernel);
  }

  /// Per-token importance over [0, tokens): attention of the last min(observation, observed)
  /// queries, summed over the group, averaged over the queries.
  std::vector<float> token_importance(const PlacementInput& in) const {
    validate();
    KVD_EXPECT(in.keys != nullptr && in.tokens >= 1 && in.head_dim >= 1 && in.group >= 1 && in.page_tokens >= 1,
               "placement: empty or malformed input ({} tokens, head_dim {}, group {})", in.tokens, in.head_dim, in.group);
    KVD_EXPECT(in.observed >= 0 && in.observed <= in.tokens && (in.observed == 0 || in.queries != nullptr),
               "placement: {} observation queries for {} tokens", in.observed, in.tokens);
    const std::int64_t obs = std::min<std::int64_t>(observation, in.observed);
    std::vector<float> importance(static_cast<std::size_t>(in.tokens), 0.0f);
    if (obs == 0) return importance;
    const int d = in.head_dim;
    const auto rows = static_cast<int>(obs * in.group);
    const float* q = in.queries + static_cast<std::size_t>(in.observed - obs) * in.group * d;
    // Logits of every (query, head) row over every key, a chunk of keys at a time; the causal
    // mask is applied after (it only cuts the last `obs` keys).
    constexpr int kChunk = 2048;
    const auto n = static_cast<std::size_t>(in.tokens);
    std::vector<float> logits(static_cast<std::size_t>(rows) * n), s;
    for (std::int64_t t0 = 0; t0 < in.tokens; t0 += kChunk) {
      const int len = static_cast<int>(std::min<std::int64_t>(kChunk, in.tokens - t0));
      const int padded = attention::padded_rows(len);
      s.resize(static_cast<std::size_t>(rows) * padded);
      attention::page_scores(q, rows, in.keys + static_cast<std::size_t>(t0) * d, len, d, in.scale, s.data());
      for (int r = 0; r < rows; ++r)
        std::copy_n(s.data() + static_cast<std::size_t>(r) * padded, len, logits.data() + static_cast<std::size_t>(r) * n + t0);
    }
    std::vector<double> acc(n, 0.0);
    for (int r = 0; r < rows; ++r) {
      const std::int64_t position = in.tokens - obs + r / in.group;  // this query's own token
      const auto visible = static_cast<std::size_t>(position + 1);
      const float* l = logits.data() + static_cast<std::size_t>(r) * n;
      const float mx = *std::max_element(l, l + visible);
      double sum = 0;
      for (std::size_t t = 0; t < visible; ++t) sum += std::exp(static_cast<double>(l[t] - mx));
      for (std::size_t t = 0; t < visible; ++t) acc[t] += std::exp(static_cast<double>(l[t] - mx)) / sum;
    }
    for (std::size_t t = 0; t < n; ++t) importance[t] = static_cast<float>(acc[t] / static_cast<double>(obs));
    return importance;
  }

  /// Candidate pages [first, end) of full pages, best first by pooled importance (ties: the
  /// lower page), with their plain importance as scores.
  PageRanking rank(const PlacementInput& in, std::uint32_t first, std::uint32_t end) const {
    const std::vector<float> imp = token_importance(in);
    const std::int64_t full_pages = in.tokens / in.page_tokens;
    KVD_EXPECT(first <= end && static_cast<std::int64_t>(end) <= full_pages, "placement: candidates [{}, {}) beyond the {} full pages", first, end,
               full_pages);
    // Max-pool over tokens, then each page's pooled sum ranks it.
    const int half = pool_kernel / 2;
    const auto n = static_cast<std::int64_t>(imp.size());
    std::vector<float> pooled(imp.size());
    for (std::int64_t t = 0; t < n; ++t) {
      float m = 0;
      for (std::int64_t u = std::max<std::int64_t>(0, t - half); u <= std::min(n - 1, t + half); ++u)
        m = std::max(m, imp[static_cast<std::size_t>(u)]);
      pooled[static_cast<std::size_t>(t)] = m;
    }
    const auto page_sum = [&](const std::vector<float>& v, std::uint32_t p) {
      double sum = 0;
      for (int i = 0; i < in.page_tokens; ++i) sum += v[static_cast<std::size_t>(p) * in.page_tokens + i];
      return static_cast<float>(sum);
    };
    PageRanking r;
    r.pages.resize(end - first);
    std::iota(r.pages.begin(), r.pages.end(), first);
    std::vector<float> rank_score(r.pages.size());
    for (std::size_t i = 0; i < r.pages.size(); ++i) rank_score[i] = page_sum(pooled, r.pages[i]);
    std::vector<std::size_t> order(r.pages.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rank_score[a] > rank_score[b]; });
    std::vector<std::uint32_t> pages(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) pages[i] = r.pages[order[i]];
    r.pages = std::move(pages);
    for (std::uint32_t p : r.pages) r.scores.push_back(page_sum(imp, p));
    return r;
  }
};
static_assert(PlacementPolicy<ImportanceGuided>);

}  // namespace kvdrive::tier
