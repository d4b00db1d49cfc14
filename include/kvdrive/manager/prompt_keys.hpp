// The prompt's keys of one stream as float, read back through the PageStore from wherever its
// pages live (fast slots, addressable tiers, or reads from the others), and a KV head's group of
// observation queries: what warm-up placement and cluster tuning score pages with.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/tier/page_key.hpp"
#include "kvdrive/tier/tiers.hpp"

namespace kvdrive::manager {

/// Where read_prompt_keys() also keeps the pages that live on the last tier: their ids
/// (ascending) and bytes, for packing and for copies into the middle tiers.
struct LastTierPages {
  std::vector<std::uint32_t> pages;
  std::vector<std::byte> bytes;
  void clear() {
    pages.clear();
    bytes.clear();
  }
};

/// The keys of a stream's first `tokens` tokens as float, [tokens][head_dim], in `keys`. Pages
/// that left the fast tier are read back (into `scratch`, page_bytes(); counted in key_bytes per
/// tier) and decoded where the tiers hold them coded. With `last`, the pages that live on the
/// last tier are kept there as that tier holds them (coded, with a cold codec).
template <class Store, class StreamT>
void read_prompt_keys(Store& store, const Config& cfg, const StreamT& st, const tier::PageKey& base, std::int64_t tokens, std::vector<float>& keys,
                      std::byte* scratch, std::array<std::uint64_t, kMaxTiers>& key_bytes, LastTierPages* last) {
  const int d = cfg.shape.head_dim, pt = cfg.page_tokens;
  keys.assign(static_cast<std::size_t>(tokens) * d, 0.0f);
  std::vector<std::byte> read(store.stored_bytes());
  for (std::int64_t page = 0; page * pt < tokens; ++page) {
    tier::PageKey key = base;
    key.page = static_cast<std::uint32_t>(page);
    const PageEntry& e = st.pages[static_cast<std::size_t>(page)];
    const std::byte* bytes = nullptr;   // the page in the KV dtype
    const std::byte* stored = nullptr;  // the page as its home tier holds it
    if (e.slot < 0 && e.home != 0) {
      stored = store.read_stored(e.home, key, read.data());
      if (stored == read.data()) key_bytes[e.home] += store.stored_bytes();
      bytes = stored;
      if (store.coded()) {
        store.decode(stored, scratch);
        bytes = scratch;
      }
    } else {
      bytes = store.host_bytes(e, key, scratch);
      if (last && e.home == Store::kLastTier) {
        stored = bytes;
        if (store.coded()) {  // the slot holds the page in the KV dtype: the tier's copy is coded
          stored = store.read_stored(e.home, key, read.data());
          if (stored == read.data()) key_bytes[e.home] += store.stored_bytes();
        }
      }
    }
    if (last && e.home == Store::kLastTier) {
      last->pages.push_back(key.page);
      last->bytes.insert(last->bytes.end(), stored, stored + store.stored_bytes());
    }
    const auto rows = static_cast<std::size_t>(std::min<std::int64_t>(pt, tokens - page * pt));
    store.decode_block(bytes, keys.data() + static_cast<std::size_t>(page) * pt * d, rows * d);
  }
}

/// KV head h's group of query heads from q_obs, as [observed][group][head_dim] in `out`.
inline void group_queries(const Config& cfg, View<const float, 3> q_obs, int h, std::vector<float>& out) {
  const int g = cfg.group(), d = cfg.shape.head_dim;
  out.resize(static_cast<std::size_t>(q_obs.extent(0)) * g * d);
  for (std::int64_t i = 0; i < q_obs.extent(0); ++i)
    for (int j = 0; j < g; ++j) std::copy_n(q_obs.row(i, h * g + j), d, out.data() + (static_cast<std::size_t>(i) * g + j) * d);
}

}  // namespace kvdrive::manager
