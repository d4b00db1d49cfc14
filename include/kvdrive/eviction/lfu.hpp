// eviction::Lfu: the pages selected least often since they entered the cache leave first
// (ties: the less recently selected, then the higher page id). A page's count starts again
// when it re-enters after an eviction. It fills its whole capacity and ignores scores.
#pragma once

#include <string_view>
#include <tuple>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"
#include "kvdrive/eviction/ranked_cache.hpp"

namespace kvdrive::eviction {

/// Lfu's rank: the more often selected stays, then the more recent, then the lower page.
struct FrequencyRank {
  static constexpr std::string_view kName = "lfu";
  static auto keep_key(const CacheEntry& e) { return std::tuple(e.uses, e.last_step, ~e.page); }
};

using Lfu = RankedCache<FrequencyRank>;  ///< Lfu{window}
static_assert(EvictionPolicy<Lfu>);

}  // namespace kvdrive::eviction
