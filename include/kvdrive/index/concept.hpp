// IndexPolicy: how critical pages are selected. An index keeps per-stream State built from the
// stream's sealed pages' keys at prefill and extended page by page as decode seals new pages.
// Given the query heads of a GQA group it returns, in ascending order, the candidate pages with
// the best estimated scores within the budget. Sink and local pages are the manager's business:
// they are never candidates. select() is const on the state, so it commits nothing (Decision 8)
// and may run on any thread.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvdrive/core/dtype.hpp"

namespace kvdrive::index {

/// The keys of consecutive sealed pages of one stream, as float, in the KV dtype's precision:
/// [pages][page_tokens][head_dim], page ids first_page .. first_page + pages - 1. `dtype` is the
/// KV dtype: indices store their data in it (Decision: index data costs what the KV costs).
struct PageKeys {
  const float* data = nullptr;
  std::int64_t first_page = 0;
  std::int64_t pages = 0;
  int page_tokens = 0;
  int head_dim = 0;
  DType dtype = DType::f32;

  const float* page(std::int64_t i) const { return data + static_cast<std::size_t>(i) * page_tokens * head_dim; }
};

/// One selection request for one stream.
struct IndexQuery {
  const float* q = nullptr;  ///< [group][head_dim], the group's query heads
  int group = 1;
  int head_dim = 0;
  float scale = 1.0f;                ///< softmax scale
  std::int64_t first_candidate = 0;  ///< candidates are pages [first_candidate, end_candidate)
  std::int64_t end_candidate = 0;
  std::int64_t budget_pages = 0;  ///< how many to select, already clamped to the candidates

  std::int64_t candidates() const { return end_candidate - first_candidate; }
};

template <class I>
concept IndexPolicy = std::copy_constructible<I> && requires(const I& index, typename I::State& state, const typename I::State& cstate,
                                                             const PageKeys& keys, const IndexQuery& query, std::vector<std::uint32_t>& out) {
  typename I::State;
  requires std::default_initializable<typename I::State>;
  { I::name() } -> std::convertible_to<std::string_view>;
  { index.build(state, keys) } -> std::same_as<void>;   // prefill: all sealed pages
  { index.append(state, keys) } -> std::same_as<void>;  // decode: newly sealed pages
  { index.select(cstate, query, out) } -> std::same_as<void>;
  { index.bytes(cstate) } -> std::convertible_to<std::size_t>;
};

/// An index that also selects for many streams in one call (on a GPU, one launch: cuda::
/// DeviceHierarchical): select_batch(states, queries, outs) must give each stream what select()
/// would, up to the index's own arithmetic. KvManager selects a micro-batch's streams with it
/// where the index has it.
template <class I>
concept BatchSelectIndex = IndexPolicy<I> && requires(const I& index, std::span<const typename I::State* const> states,
                                                      std::span<const IndexQuery> queries, std::span<std::vector<std::uint32_t>* const> outs) {
  { index.select_batch(states, queries, outs) } -> std::same_as<void>;
};

/// Policies whose parameters depend on the head dimension (ProductQuant's subspaces must divide
/// it) may define `void check(int head_dim) const`, throwing kvdrive::Error when they do not fit.
/// KvManager calls it when it is constructed, since build() and append() must not throw.
template <class I>
void check_for_head_dim(const I& index, int head_dim) {
  if constexpr (requires { index.check(head_dim); }) index.check(head_dim);
}

}  // namespace kvdrive::index
