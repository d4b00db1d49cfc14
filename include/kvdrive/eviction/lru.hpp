// eviction::Lru: the least recently selected pages leave first (ties: the higher page id leaves
// first). It fills its whole capacity and ignores attention scores: Lookahead's baseline.
#pragma once

#include <string_view>
#include <utility>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"
#include "kvdrive/eviction/ranked_cache.hpp"

namespace kvdrive::eviction {

/// Lru's rank: the more recently selected stays, then the lower page.
struct RecencyRank {
  static constexpr std::string_view kName = "lru";
  static auto keep_key(const CacheEntry& e) { return std::pair(e.last_step, ~e.page); }
};

using Lru = RankedCache<RecencyRank>;  ///< Lru{window}
static_assert(EvictionPolicy<Lru>);

}  // namespace kvdrive::eviction
