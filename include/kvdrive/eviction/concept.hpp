// EvictionPolicy: owns the metadata of one stream's fast-tier cache (which pages it holds).
// classify asks contains(); after compute the manager calls update() with the pages that went
// through the cache this step and their attention mass. Every such page becomes cached (a hit is
// refreshed, a miss is admitted), then the policy shrinks the cache and reports the pages it
// evicted, which may include pages admitted this step. Nothing is evicted before compute, and
// update() runs in the commit stage only (Decisions 6 and 8), after the step's point of no
// return: it must not throw.
//
// The manager passes each stream's window W and capacity in the update: W comes from the
// manager's WindowPlan (eviction/window_plan.hpp) or, without one, from the policy's
// default_window(); the capacity is W x the step's budget pages. Policies with a fixed window
// (None, LastStep) declare kFixedWindow; KvManager refuses plans for them.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kvdrive::eviction {

struct CacheUpdate {
  std::span<const std::uint32_t> pages;  ///< ascending page ids that went through the cache
  std::span<const float> scores;         ///< attention mass of each, summed over the group
  std::uint64_t step = 0;                ///< this stream's decode step, from 1 (0 = warm-up)
  int window = 0;                        ///< W: how many past steps' pages the policy may keep
  std::size_t capacity = 0;              ///< pages the cache may keep after the update
};

template <class E>
concept EvictionPolicy = std::copy_constructible<E> && requires(const E& e, typename E::State& state, const typename E::State& cstate,
                                                                std::uint32_t page, const CacheUpdate& update, std::vector<std::uint32_t>& evicted) {
  typename E::State;
  requires std::default_initializable<typename E::State>;
  { E::name() } -> std::convertible_to<std::string_view>;
  { e.default_window() } -> std::convertible_to<int>;  // W without a window plan
  { e.contains(cstate, page) } -> std::same_as<bool>;
  { e.size(cstate) } -> std::convertible_to<std::size_t>;
  { e.update(state, update, evicted) } -> std::same_as<void>;
};

/// True for policies whose window is part of their definition (None: 0, LastStep: 1).
template <class E>
inline constexpr bool kHasFixedWindow = requires {
  E::kFixedWindow;
};

}  // namespace kvdrive::eviction
