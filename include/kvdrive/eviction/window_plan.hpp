// WindowPlan: the window W of each (layer, KV head), which sets how many past steps' critical
// pages its cache keeps and, as W x budget pages, its capacity. Uniform gives every stream the
// same W; eviction/knapsack.hpp picks one W per stream from a profile (KVDrive's 2D window
// scaling). Give a plan to KvManager::set_window_plan; without one the policy's W applies.
//
// Bytes: the fast tier holds, per stream, the resident sink and local pages (plus the partial
// tail page) and the cache. cache_bytes_for() turns a total fast-tier byte budget into the
// bytes left for caches, and refuses a budget below what sink and local need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/page_ranges.hpp"

namespace kvdrive::eviction {

struct WindowPlan {
  int layers = 0;
  int kv_heads = 0;
  std::vector<int> windows;  ///< [layer][kv_head]

  static WindowPlan uniform(const ModelShape& shape, int window) {
    KVD_EXPECT(window >= 0, "window plan: W = {} is negative", window);
    shape.validate();
    return WindowPlan{shape.layers, shape.kv_heads, std::vector<int>(static_cast<std::size_t>(shape.layers) * shape.kv_heads, window)};
  }

  std::size_t streams() const { return windows.size(); }

  int window(int layer, int head) const {
    KVD_EXPECT(layer >= 0 && layer < layers && head >= 0 && head < kv_heads, "window plan: (layer {}, head {}) outside {} x {}", layer, head, layers,
               kv_heads);
    return windows[static_cast<std::size_t>(layer) * kv_heads + head];
  }

  /// Sum of W over the streams: the plan's cache size in units of one step's budget.
  std::int64_t total_window() const {
    std::int64_t t = 0;
    for (int w : windows) t += w;
    return t;
  }

  /// Throws unless the plan covers exactly `shape`'s streams with W >= 0.
  void validate(const ModelShape& shape) const {
    KVD_EXPECT(layers == shape.layers && kv_heads == shape.kv_heads && windows.size() == static_cast<std::size_t>(layers) * kv_heads,
               "window plan: {} x {} streams ({} windows) do not match the model's {} layers x {} KV heads", layers, kv_heads, windows.size(),
               shape.layers, shape.kv_heads);
    for (std::size_t i = 0; i < windows.size(); ++i)
      KVD_EXPECT(windows[i] >= 0, "window plan: W = {} for layer {} head {} is negative", windows[i], i / kv_heads, i % kv_heads);
  }
};

/// Fast-tier pages one stream of `context` tokens keeps resident: sink, local and the tail.
inline std::int64_t resident_pages(const Config& c, std::int64_t context) {
  const PageRanges r = page_ranges(context + 1, c.page_tokens, c.sink_tokens, c.local_tokens);
  return r.sink_end + (r.pages - r.local_begin);
}

/// Bytes one step of window costs a stream at `context` tokens: its budget in pages.
inline std::size_t window_step_bytes(const Config& c, std::int64_t context) {
  const PageRanges r = page_ranges(context + 1, c.page_tokens, c.sink_tokens, c.local_tokens);
  return static_cast<std::size_t>(c.budget.pages_for(r.candidates())) * c.page_bytes();
}

/// Of `total_bytes` of fast memory for `streams` streams of `context` tokens, the bytes left
/// for caches once sink and local pages are resident. Throws if they do not fit.
inline std::size_t cache_bytes_for(const Config& c, std::int64_t context, std::size_t streams, std::size_t total_bytes) {
  const std::size_t resident = static_cast<std::size_t>(resident_pages(c, context)) * c.page_bytes() * streams;
  KVD_EXPECT(total_bytes >= resident,
             "cache budget of {} bytes is below the {} bytes that sink and local pages need ({} streams x {} pages of {} bytes "
             "at {} tokens)",
             total_bytes, resident, streams, resident_pages(c, context), c.page_bytes(), context);
  return total_bytes - resident;
}

/// The largest W that every stream can have within `cache_bytes` (capped at max_window).
inline WindowPlan uniform_for_bytes(const Config& c, std::int64_t context, std::size_t cache_bytes, int max_window) {
  KVD_EXPECT(max_window >= 0, "window plan: max_window {} is negative", max_window);
  const std::size_t per_w = window_step_bytes(c, context) * static_cast<std::size_t>(c.shape.layers) * c.shape.kv_heads;
  const std::size_t w = per_w ? cache_bytes / per_w : static_cast<std::size_t>(max_window);
  return WindowPlan::uniform(c.shape, static_cast<int>(std::min<std::size_t>(w, static_cast<std::size_t>(max_window))));
}

}  // namespace kvdrive::eviction
