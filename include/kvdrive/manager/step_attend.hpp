// The compute stage of a decode step (manager/step.hpp): a stream attends its sink, selected and
// local pages in splits of attention::kSplitPages pages, merged by log-sum-exp (Decision 4); the
// resident splits may go first, while the misses are read (compute_ready). With a device fast
// tier the streams' page lists go to the backend as one PagedDecode instead. Either way each
// page that went through the cache is scored by its attention mass, for eviction.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/backend/concept.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::manager {

template <class Core, class Store, class Plan>
class StepAttention {
 public:
  StepAttention(Core& c, Store& store) : c_(c), store_(store) {}

  /// Attends the plans: on the backend's threads, a split a task; with a device fast tier, in one
  /// launch.
  void compute(std::span<Plan> plans) const {
    if constexpr (Core::kDeviceFast) compute_on_device(plans);
    else compute_on_host(plans);
  }

  /// The resident splits first (host only: the device attends the whole list in one launch).
  void compute_ready(std::span<Plan> plans) const {
    if constexpr (!Core::kDeviceFast) {
      SplitTasks& tasks = split_tasks();
      tasks.clear();
      for (std::size_t j = 0; j < plans.size(); ++j) {
        Plan& p = plans[j];
        prepare_splits(p);
        for (std::size_t s = 0; s < p.split_done.size(); ++s)
          if (!p.split_done[s] && split_resident(p, s)) tasks.push_back({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(s)});
      }
      c_.backend.parallel_for(tasks.size(), [&](std::size_t i) {
        Plan& p = plans[tasks[i].plan];
        const std::size_t s = tasks[i].split, a = split_begin(s), b = split_end(s, p.attended.size());
        thread_local std::vector<attention::PageRef> refs;  // per worker, reused step after step
        refs.clear();
        for (std::size_t k = a; k < b; ++k) refs.push_back(page_ref(p, p.attended[k]));
        compute_split(p, s, refs);
      });
    }
  }

  /// Every split of every plan a task, so that a few streams (SmolLM2 has 3 KV heads) keep every
  /// thread busy: the task fills the split's page references and attends it unless compute_ready
  /// did; then each plan's splits merge, in split order, into p.out and p.lse. Each split's result
  /// is the same whichever thread computes it.
  void compute_on_host(std::span<Plan> plans) const {
    SplitTasks& tasks = split_tasks();
    tasks.clear();
    for (std::size_t j = 0; j < plans.size(); ++j) {
      Plan& p = plans[j];
      prepare_splits(p);
      p.refs.resize(p.attended.size());
      for (std::size_t s = 0; s < p.split_done.size(); ++s) tasks.push_back({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(s)});
    }
    c_.backend.parallel_for(tasks.size(), [&](std::size_t i) {
      Plan& p = plans[tasks[i].plan];
      const std::size_t s = tasks[i].split, a = split_begin(s), b = split_end(s, p.refs.size());
      for (std::size_t k = a; k < b; ++k) p.refs[k] = page_ref(p, p.attended[k]);
      if (!p.split_done[s]) compute_split(p, s, std::span<const attention::PageRef>(p.refs).subspan(a, b - a));
    });
    for (Plan& p : plans) merge(p);
  }

  /// The device path: the plans' page lists (slot addresses in device memory) go to the backend
  /// as one PagedDecode, and the results come back to the plans as compute_on_host leaves them.
  void compute_on_device(std::span<Plan> plans) const {
    const std::size_t g = static_cast<std::size_t>(c_.cfg.group()), d = static_cast<std::size_t>(c_.cfg.shape.head_dim);
    std::vector<float> q, out(plans.size() * g * d), lse(plans.size() * g), page_lse;
    std::vector<std::uint32_t> offsets{0};
    std::vector<const std::byte*> pages;
    std::vector<std::int32_t> tokens;
    for (Plan& p : plans) {
      prepare_splits(p);
      for (std::uint32_t page : p.attended) {
        p.refs.push_back(page_ref(p, page));
        pages.push_back(static_cast<const std::byte*>(p.refs.back().k));
        tokens.push_back(p.refs.back().tokens);
      }
      q.insert(q.end(), p.q.begin(), p.q.end());
      offsets.push_back(static_cast<std::uint32_t>(pages.size()));
    }
    page_lse.resize(pages.size() * g);
    c_.backend.attend(paged_decode(plans.size(), q, offsets, pages, tokens, out, lse, page_lse));
    for (std::size_t j = 0; j < plans.size(); ++j) {
      Plan& p = plans[j];
      p.out.assign(out.begin() + static_cast<std::ptrdiff_t>(j * g * d), out.begin() + static_cast<std::ptrdiff_t>((j + 1) * g * d));
      p.lse.assign(lse.begin() + static_cast<std::ptrdiff_t>(j * g), lse.begin() + static_cast<std::ptrdiff_t>((j + 1) * g));
      std::copy_n(page_lse.begin() + static_cast<std::ptrdiff_t>(offsets[j] * g), p.attended.size() * g, p.page_lse.begin());
      std::fill(p.split_done.begin(), p.split_done.end(), std::uint8_t{1});
      score_cache_pages(p);
    }
  }

 private:
  struct SplitTask {
    std::uint32_t plan, split;
  };
  using SplitTasks = std::vector<SplitTask>;
  /// The calling thread's task list, reused step after step.
  static SplitTasks& split_tasks() {
    thread_local SplitTasks tasks;
    return tasks;
  }

  /// Whether split s of p has no miss among its pages.
  static bool split_resident(const Plan& p, std::size_t s) {
    for (std::size_t i = split_begin(s), b = split_end(s, p.attended.size()); i < b; ++i)
      if (std::binary_search(p.misses.begin(), p.misses.end(), p.attended[i])) return false;
    return true;
  }

  /// p.out and p.lse from p's splits, merged in order; then the cache pages' eviction scores.
  void merge(Plan& p) const {
    const int g = c_.cfg.group(), d = c_.cfg.shape.head_dim;
    p.out.resize(static_cast<std::size_t>(g) * d);
    p.lse.resize(static_cast<std::size_t>(g));
    attention::merge_splits(g, d, p.split_done.size(), p.split_out.data(), p.split_lse.data(), p.out.data(), p.lse.data());
    score_cache_pages(p);
  }

  static std::size_t split_begin(std::size_t s) { return s * attention::kSplitPages; }
  static std::size_t split_end(std::size_t s, std::size_t n) { return std::min(n, split_begin(s) + attention::kSplitPages); }

  /// Where the backend attends a page this step: the new tail slot, a resident or staged slot,
  /// or the page where it lives on an addressable tier.
  const std::byte* attend_address(const Plan& p, std::uint32_t page) const {
    if (page == p.tail_page() && p.new_tail >= 0) return store_.slot_address(p.new_tail);
    const PageEntry& e = p.stream->pages[page];
    if (e.slot >= 0) return store_.slot_address(e.slot);
    const auto it = std::lower_bound(p.misses.begin(), p.misses.end(), page);
    if (it != p.misses.end() && *it == page) return store_.slot_address(p.staged[static_cast<std::size_t>(it - p.misses.begin())]);
    const std::byte* addr = store_.in_place_address(e.home, p.key(page));
    KVD_EXPECT(addr != nullptr, "page {} is not resident and its tier {} is not addressable", p.key(page), e.home);
    return addr;
  }

  attention::PageRef page_ref(const Plan& p, std::uint32_t page) const {
    const Config& c = c_.cfg;
    const std::byte* bytes = attend_address(p, page);
    const std::int64_t tokens_after = p.stream->pages.tokens + 1;
    const int tokens = page == p.tail_page() ? static_cast<int>(tokens_after - static_cast<std::int64_t>(page) * c.page_tokens) : c.page_tokens;
    return {bytes, bytes + c.block_bytes(), tokens};
  }

  /// The attended pages in list order (sink, selected, local) and room for every split's
  /// result, once per step.
  void prepare_splits(Plan& p) const {
    if (!p.split_done.empty() || p.ranges.pages == 0) return;
    const int g = c_.cfg.group(), d = c_.cfg.shape.head_dim;
    for (std::int64_t page = 0; page < p.ranges.sink_end; ++page) p.attended.push_back(static_cast<std::uint32_t>(page));
    p.attended.insert(p.attended.end(), p.selected.begin(), p.selected.end());
    for (std::int64_t page = p.ranges.local_begin; page < p.ranges.pages; ++page) p.attended.push_back(static_cast<std::uint32_t>(page));
    const std::size_t splits = attention::split_count(p.attended.size());
    p.split_out.resize(splits * static_cast<std::size_t>(g) * d);
    p.split_lse.resize(splits * static_cast<std::size_t>(g));
    p.page_lse.resize(p.attended.size() * static_cast<std::size_t>(g));
    p.split_done.assign(splits, 0);
  }

  /// Attends split s of p's pages (refs: its pages, in order).
  void compute_split(Plan& p, std::size_t s, std::span<const attention::PageRef> refs) const {
    const Config& c = c_.cfg;
    const int g = c.group(), d = c.shape.head_dim;
    attention::DecodeArgs args;
    args.q = p.q.data();
    args.group = g;
    args.head_dim = d;
    args.scale = c.scale();
    args.pages = refs;
    args.out = p.split_out.data() + s * static_cast<std::size_t>(g) * d;
    args.lse = p.split_lse.data() + s * static_cast<std::size_t>(g);
    args.page_lse = p.page_lse.data() + split_begin(s) * static_cast<std::size_t>(g);
    dispatch_dtype(c.dtype, [&](auto tag) { attention::sparse_decode<typename decltype(tag)::type>(args); });
    p.split_done[s] = 1;
  }

  /// Eviction scores: the attention mass of each page that went through the cache.
  void score_cache_pages(Plan& p) const {
    const int g = c_.cfg.group();
    const auto first_selected = static_cast<std::size_t>(p.ranges.sink_end);
    for (std::uint32_t page : p.through_cache) {
      const auto pos = static_cast<std::size_t>(std::lower_bound(p.selected.begin(), p.selected.end(), page) - p.selected.begin());
      const float* lse_p = p.page_lse.data() + (first_selected + pos) * g;
      float mass = 0.0f;
      for (int h = 0; h < g; ++h) mass += attention::page_mass(lse_p[h], p.lse[h]);
      p.cache_scores.push_back(mass);
    }
  }

  backend::PagedDecode paged_decode(std::size_t streams, const std::vector<float>& q, const std::vector<std::uint32_t>& offsets,
                                    const std::vector<const std::byte*>& pages, const std::vector<std::int32_t>& tokens, std::vector<float>& out,
                                    std::vector<float>& lse, std::vector<float>& page_lse) const {
    const Config& c = c_.cfg;
    backend::PagedDecode pd;
    pd.dtype = c.dtype;
    pd.group = c.group();
    pd.head_dim = c.shape.head_dim;
    pd.page_tokens = c.page_tokens;
    pd.block_bytes = c.block_bytes();
    pd.scale = c.scale();
    pd.streams = streams;
    pd.q = q.data();
    pd.offsets = offsets;
    pd.pages = pages;
    pd.tokens = tokens;
    pd.out = out.data();
    pd.lse = lse.data();
    pd.page_lse = page_lse.data();
    return pd;
  }

  Core& c_;
  Store& store_;
};

}  // namespace kvdrive::manager
