// eviction::Lookahead: KVDrive's sliding-window cache, ranked by attention (DESIGN.md Decision
// 6). The pages selected in the last W steps are kept first; older pages stay while there is
// room. Within each group, pages with the most attention stay: a page's score is its attention
// mass (summed over the group's heads), accumulated over the steps that selected it while cached
// and decayed by `decay` per step, so a page that drew much attention lately is expected to be
// critical again next step, the paper's observation. Ties: the more recent, then the lower page.
//
// Measured on the default synthetic trace and a real-model trace (docs/eviction.md): with the
// window kept whole, ranking the rest by attention beats ranking it by recency (Lru) on the real
// model's trace, where a few pages keep drawing attention, and matches it within ~0.1 points on
// the synthetic one. Dropping every page older than W steps outright, the first reading of
// Decision 6, loses ~6 points to Lru at equal bytes: it leaves part of the capacity unused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct Lookahead {
  int window = 3;       ///< W without a window plan
  float decay = 0.25f;  ///< per-step decay of a page's accumulated attention, clamped to [0, 1]

  using State = CacheEntries;

  static constexpr std::string_view name() { return "lookahead"; }
  int default_window() const { return window; }
  bool contains(const State& s, std::uint32_t page) const { return s.contains(page); }
  std::size_t size(const State& s) const { return s.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    const float d = !(decay > 0.0f) ? 0.0f : decay > 1.0f ? 1.0f : decay;  // NaN: 0
    s.touch(u, d);
    const auto w = static_cast<std::uint64_t>(u.window > 0 ? u.window : 0);
    // Keep first: in the window, then the higher decayed score, the more recent, the lower page.
    if (s.size() <= u.capacity) return;
    std::array<float, 65> power{};  // decay^age for the ages a window plan makes common
    power[0] = 1.0f;
    for (std::size_t i = 1; i < power.size(); ++i) power[i] = power[i - 1] * d;
    const auto decayed = [&](std::uint64_t age) { return age < power.size() ? power[age] : CacheEntries::decayed(d, age); };
    s.drop_least(
        u.capacity,
        [&](const CacheEntry& e) { return std::tuple(e.last_step + w > u.step, e.score * decayed(u.step - e.last_step), e.last_step, ~e.page); },
        evicted);
  }
};
static_assert(EvictionPolicy<Lookahead>);

}  // namespace kvdrive::eviction
