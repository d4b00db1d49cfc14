// Clustering of page mean keys for the clustered indices (Hierarchical, Centroid): Lloyd's
// k-means in which each point may only move to the clusters of a neighbourhood, and never
// leaves a cluster empty. With a neighbourhood of nearby segments it is the locality-keeping
// clustering of KVDrive's hierarchy (neighbouring pages stay together); with every cluster as
// the neighbourhood it is plain k-means. Deterministic: no random initialisation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive::index {

/// Squared Euclidean distance over d elements (8 partial sums, vectorisable).
KVD_HOST_DEVICE float l2_squared(const float* a, const float* b, int d) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < d; ++j) {
    const float x = a[j] - b[j];
    s[j & 7] += x * x;
  }
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/// centroids[c] = mean of the points assigned to c, for k clusters; returns the member counts.
inline std::vector<std::uint32_t> cluster_means(const float* points, std::int64_t n, int d, int k, std::span<const std::uint32_t> assign,
                                                std::vector<float>& centroids) {
  const auto du = static_cast<std::size_t>(d);
  centroids.assign(static_cast<std::size_t>(k) * du, 0.0f);
  std::vector<std::uint32_t> count(static_cast<std::size_t>(k), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    float* c = centroids.data() + assign[static_cast<std::size_t>(i)] * du;
    const float* x = points + static_cast<std::size_t>(i) * du;
    for (std::size_t j = 0; j < du; ++j) c[j] += x[j];
    ++count[assign[static_cast<std::size_t>(i)]];
  }
  for (int c = 0; c < k; ++c)
    if (count[static_cast<std::size_t>(c)] > 0) {
      const float inv = 1.0f / static_cast<float>(count[static_cast<std::size_t>(c)]);
      for (std::size_t j = 0; j < du; ++j) centroids[static_cast<std::size_t>(c) * du + j] *= inv;
    }
  return count;
}

/// Lloyd iterations over points [n][d] and k clusters. assign holds a starting assignment in
/// which no cluster is empty; point i may move only to clusters [range(i).first, range(i).second]
/// (inclusive), and not out of a cluster it is the last member of. Stops early when nothing
/// moves. On return centroids [k][d] are the means of the final assignment.
template <class Range>
void local_lloyd(const float* points, std::int64_t n, int d, int k, std::vector<std::uint32_t>& assign, int iterations, Range range,
                 std::vector<float>& centroids) {
  std::vector<std::uint32_t> count = cluster_means(points, n, d, k, assign, centroids);
  for (int it = 0; it < iterations; ++it) {
    bool moved = false;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t from = assign[static_cast<std::size_t>(i)];
      if (count[from] <= 1) continue;
      const float* x = points + static_cast<std::size_t>(i) * d;
      const auto [lo, hi] = range(i);
      std::uint32_t best = from;
      float best_d = l2_squared(x, centroids.data() + static_cast<std::size_t>(from) * d, d);
      for (std::uint32_t c = static_cast<std::uint32_t>(lo); c <= static_cast<std::uint32_t>(hi); ++c) {
        if (c == from) continue;
        const float dist = l2_squared(x, centroids.data() + static_cast<std::size_t>(c) * d, d);
        if (dist < best_d) best_d = dist, best = c;
      }
      if (best != from) {
        --count[from];
        ++count[best];
        assign[static_cast<std::size_t>(i)] = best;
        moved = true;
      }
    }
    count = cluster_means(points, n, d, k, assign, centroids);
    if (!moved) break;
  }
}

}  // namespace kvdrive::index
