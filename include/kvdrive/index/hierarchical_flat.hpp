// HierarchicalFlat: one stream's Hierarchical index as flat arrays, the layout the GPU's
// two-level selection reads (cuda/hierarchical.cuh uploads it): the centroids and radii, then
// the members of every cluster in cluster order, each with its page id, its mean (in the KV
// dtype's bytes) and its cluster, with CSR offsets per cluster; with pair radii, each member's
// radii and the stream's pairs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvdrive/index/hierarchical.hpp"

namespace kvdrive::index {

/// One stream's Hierarchical index as flat arrays (host side), in the KV dtype's bytes.
struct HierarchicalFlat {
  DType dtype = DType::f32;  ///< of the centroids and means
  int head_dim = 0;
  std::vector<std::byte> centroids;           ///< [clusters][head_dim]
  std::vector<float> radius;                  ///< [clusters]
  std::vector<std::int64_t> member_offsets;   ///< [clusters + 1]
  std::vector<std::uint32_t> member_pages;    ///< [members], ascending within a cluster
  std::vector<std::byte> member_means;        ///< [members][head_dim]
  std::vector<std::uint32_t> member_cluster;  ///< [members]
  std::vector<std::byte> member_radii;        ///< [members][pairs] (empty without pair radii)
  std::vector<std::uint8_t> pairs;            ///< the rotary pairs the radii are of

  std::int64_t clusters() const { return static_cast<std::int64_t>(radius.size()); }
  std::int64_t members() const { return static_cast<std::int64_t>(member_pages.size()); }
};

/// Flattens one stream's Hierarchical::State.
inline HierarchicalFlat flatten(const Hierarchical::State& s) {
  HierarchicalFlat f;
  f.dtype = s.dtype;
  f.head_dim = s.head_dim;
  f.centroids = s.centroids;
  f.radius = s.radius;
  f.pairs = s.pairs;
  f.member_offsets.push_back(0);
  for (std::size_t c = 0; c < s.clusters.size(); ++c) {
    const Hierarchical::Cluster& cl = s.clusters[c];
    f.member_pages.insert(f.member_pages.end(), cl.pages.begin(), cl.pages.end());
    f.member_means.insert(f.member_means.end(), cl.means.begin(), cl.means.end());
    f.member_radii.insert(f.member_radii.end(), cl.radii.begin(), cl.radii.end());
    f.member_cluster.insert(f.member_cluster.end(), cl.pages.size(), static_cast<std::uint32_t>(c));
    f.member_offsets.push_back(static_cast<std::int64_t>(f.member_pages.size()));
  }
  return f;
}

}  // namespace kvdrive::index
