// Radix selection of a threshold among unique 64-bit keys (index::selection_key), 8 bits at a
// time from the top, as the GPU's selection kernels do it (cuda/top_k.cuh, cuda/hierarchical.cuh)
// where sorting every key would not fit a block. Weighted: each key carries a weight (1 for a
// plain top-k; a cluster's candidate pages when choosing clusters to expand), and the threshold
// is the largest key K whose keys >= K weigh at least `target` in all; where all keys together
// weigh less, K is 0 and every key is taken. The digit step is KVD_HOST_DEVICE code shared with
// the kernels; radix_threshold() is its CPU form, which the tests check against a sort.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive::index {

/// One digit of the descent: hist[b] is the weight of the keys that match the threshold's digits
/// so far and have digit b here; `left` is the weight still to reach. Returns the threshold's
/// digit and lowers `left` by the weight of the keys above that digit.
KVD_HOST_DEVICE int radix_select_digit(const unsigned long long* hist, unsigned long long& left) {
  int b = 255;
  for (; b > 0 && hist[b] < left; --b) left -= hist[b];
  return b;
}

/// CPU form: the largest key K with sum of weight[i] over keys[i] >= K at least `target` (0 if
/// all keys weigh less). keys must be unique.
inline std::uint64_t radix_threshold(std::span<const std::uint64_t> keys, std::span<const unsigned> weight, unsigned long long target) {
  std::uint64_t prefix = 0, mask = 0;
  unsigned long long left = target;
  for (int shift = 56; shift >= 0; shift -= 8) {
    unsigned long long hist[256] = {};
    for (std::size_t i = 0; i < keys.size(); ++i)
      if ((keys[i] & mask) == prefix) hist[(keys[i] >> shift) & 0xFF] += weight[i];
    const int b = radix_select_digit(hist, left);
    prefix |= static_cast<std::uint64_t>(b) << shift;
    mask |= 0xFFull << shift;
  }
  return prefix;
}

}  // namespace kvdrive::index
