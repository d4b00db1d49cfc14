// Per-page summaries of a page's keys that several indices keep: the mean key (ShadowKV's
// landmark, the page representative of KVDrive's hierarchy) and the per-channel bounds (Quest).
// Computed in float from the page's keys; the indices then store them in the KV dtype.
#pragma once

#include <cstddef>

#include "kvdrive/index/concept.hpp"

namespace kvdrive::index {

/// mean[i] = average over the page's tokens of key[t][i].
inline void page_mean(const PageKeys& k, std::int64_t p, float* mean) {
  const float* page = k.page(p);
  const auto d = static_cast<std::size_t>(k.head_dim);
  for (std::size_t i = 0; i < d; ++i) mean[i] = 0.0f;
  for (int t = 0; t < k.page_tokens; ++t)
    for (std::size_t i = 0; i < d; ++i) mean[i] += page[static_cast<std::size_t>(t) * d + i];
  const float inv = 1.0f / static_cast<float>(k.page_tokens);
  for (std::size_t i = 0; i < d; ++i) mean[i] *= inv;
}

/// lo[i], hi[i] = min and max over the page's tokens of key[t][i].
inline void page_bounds(const PageKeys& k, std::int64_t p, float* lo, float* hi) {
  const float* page = k.page(p);
  const auto d = static_cast<std::size_t>(k.head_dim);
  for (std::size_t i = 0; i < d; ++i) lo[i] = hi[i] = page[i];
  for (int t = 1; t < k.page_tokens; ++t)
    for (std::size_t i = 0; i < d; ++i) {
      const float x = page[static_cast<std::size_t>(t) * d + i];
      lo[i] = x < lo[i] ? x : lo[i];
      hi[i] = x > hi[i] ? x : hi[i];
    }
}

}  // namespace kvdrive::index
