// index::Dense: selects every candidate page, whatever the budget. With it KvManager computes
// full attention, the reference the sparse indices are measured against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/index/concept.hpp"

namespace kvdrive::index {

struct Dense {
  struct State {};

  static constexpr std::string_view name() { return "dense"; }
  /// Dense ignores the budget: every candidate is selected.
  static constexpr bool kIgnoresBudget = true;

  void build(State&, const PageKeys&) const {}
  void append(State&, const PageKeys&) const {}
  void select(const State&, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    for (std::int64_t p = q.first_candidate; p < q.end_candidate; ++p) out.push_back(static_cast<std::uint32_t>(p));
  }
  std::size_t bytes(const State&) const { return 0; }
};
static_assert(IndexPolicy<Dense>);

}  // namespace kvdrive::index
