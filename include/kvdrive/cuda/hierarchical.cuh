// Hierarchical's two-level selection on the GPU (index/hierarchical.hpp says what it selects):
//   1. every cluster that holds candidate pages scores q . c + radius_weight |q| r per head; the
//      GQA rule ranks the clusters (ties to the lower cluster);
//   2. the best clusters are expanded until they hold expand x budget candidate pages (a
//      weighted radix select over the cluster keys, the weights being their candidate pages);
//   3. their members' means score per head, the GQA rule ranks them, and the budget's best pages
//      (ties to the lower page) come out as ascending page ids.
// One block per stream. The arithmetic is the shared KVD_HOST_DEVICE code (index::row_dot,
// gqa_page_score, selection_key, radix_select_digit); nvcc contracts multiply-adds into FMAs
// (and the CPU's AVX2 path sums in another order), so a page at a near-tie may differ.
//
// The index lives on the device as flat arrays (index::HierarchicalFlat, made on the host from a
// stream's Hierarchical::State by index::flatten(), uploaded by HierarchicalOnDevice):
// centroids, radii, and the members of every cluster in cluster order, each with its page id,
// mean and cluster.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include "kvdrive/core/dtype.hpp"
#include "kvdrive/cuda/block_select.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/index/hierarchical_flat.hpp"
#include "kvdrive/index/radix_select.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::cuda {

/// Device pointers to one stream's flat index.
template <class T>
struct HierarchicalDeviceIndex {
  const T* centroids = nullptr;
  const float* radius = nullptr;
  const std::int64_t* member_offsets = nullptr;
  const std::uint32_t* member_pages = nullptr;
  const T* member_means = nullptr;
  const std::uint32_t* member_cluster = nullptr;
  std::int64_t clusters = 0, members = 0;
  const T* member_radii = nullptr;      ///< [members][pair_count]
  const std::uint8_t* pairs = nullptr;  ///< [pair_count]
  int pair_count = 0;
};

/// One stream's flat index in device memory (T: the KV dtype the index stores).
template <class T>
class HierarchicalOnDevice {
 public:
  explicit HierarchicalOnDevice(const index::HierarchicalFlat& f)
      : centroids_(as_span(checked(f).centroids)),
        means_(as_span(f.member_means)),
        radii_(as_span(f.member_radii)),
        pairs_(std::span<const std::uint8_t>(f.pairs)),
        radius_(std::span<const float>(f.radius)),
        offsets_(std::span<const std::int64_t>(f.member_offsets)),
        pages_(std::span<const std::uint32_t>(f.member_pages)),
        cluster_(std::span<const std::uint32_t>(f.member_cluster)),
        clusters_(f.clusters()),
        members_(f.members()) {}

  HierarchicalDeviceIndex<T> view() const {
    return {centroids_.data(),
            radius_.data(),
            offsets_.data(),
            pages_.data(),
            means_.data(),
            cluster_.data(),
            clusters_,
            members_,
            radii_.data(),
            pairs_.data(),
            static_cast<int>(pairs_.size())};
  }

 private:
  static const index::HierarchicalFlat& checked(const index::HierarchicalFlat& f) {
    KVD_EXPECT(f.dtype == dtype_of<T>, "HierarchicalOnDevice: the index holds {} data, not {}", dtype_name(f.dtype), dtype_name(dtype_of<T>));
    return f;
  }
  static std::span<const T> as_span(const std::vector<std::byte>& bytes) {
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
  DeviceBuffer<T> centroids_, means_, radii_;
  DeviceBuffer<std::uint8_t> pairs_;
  DeviceBuffer<float> radius_;
  DeviceBuffer<std::int64_t> offsets_;
  DeviceBuffer<std::uint32_t> pages_, cluster_;
  std::int64_t clusters_, members_;
};

template <class T>
struct HierarchicalSelectParams {
  const HierarchicalDeviceIndex<T>* index = nullptr;  ///< [streams], device memory
  const float* q = nullptr;                           ///< [streams][group][head_dim]
  const std::int64_t* first_candidate = nullptr;      ///< [streams]
  const std::int64_t* end_candidate = nullptr;        ///< [streams]
  const std::int64_t* budget = nullptr;               ///< [streams]: pages to select
  float radius_weight = 0.5f;
  double expand = 8.0;
  double min_scored = 0.25;            ///< index::HierarchicalParams::min_scored
  std::int64_t score_all_below = 512;  ///< index::HierarchicalParams::score_all_below
  float pair_weight = 0.5f;            ///< members' pair radii (index::HierarchicalParams)
  index::RotaryPairs rotary = index::RotaryPairs::adjacent;
  /// Scratch per stream: estimates [group][scratch_stride] with scratch_stride >= clusters +
  /// members of every stream, counts [scratch_stride] (each cluster's candidates, then each
  /// member's take flag), and a page bitmap of bitmap_words 32-bit words (>= end_candidate / 32 + 1).
  float* scratch_est = nullptr;
  unsigned* scratch_count = nullptr;
  std::uint32_t* scratch_bitmap = nullptr;
  std::int64_t scratch_stride = 0, bitmap_words = 0;
  /// [streams][max_k]: ascending page ids. A selection larger than max_k keeps its best max_k
  /// pages (not its first max_k ids).
  std::uint32_t* out = nullptr;
  int* out_count = nullptr;  ///< [streams]: ids written
  int streams = 0, group = 1, head_dim = 0, max_k = 0;
};

/// The first position in [lo, hi) of `pages` (ascending) whose page is >= value.
KVD_HOST_DEVICE std::int64_t lower_bound_page(const std::uint32_t* pages, std::int64_t lo, std::int64_t hi, std::uint32_t value) {
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (pages[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

inline constexpr int kHierarchicalThreads = 256;
inline constexpr int kHierarchicalMaxGroup = 64;
inline constexpr int kHierarchicalMaxPairs = 8;  ///< pair radii per member the kernel scores

namespace detail {

/// The kernel's shared memory: one union of CUB's scratch, each head's reach (radius_weight |q|)
/// and largest estimate, and the radix select's histogram and state.
struct HierarchicalShared {
  union Temp {
    MaxReduce<kHierarchicalThreads>::TempStorage reduce;
    cub::BlockReduce<unsigned long long, kHierarchicalThreads>::TempStorage count;
    OrderScan<kHierarchicalThreads>::TempStorage scan;
  } temp;
  float reach[kHierarchicalMaxGroup], head_max[kHierarchicalMaxGroup];
  float qpair[kHierarchicalMaxGroup * kHierarchicalMaxPairs];  // |q_pair| per head and chosen pair
  unsigned long long hist[256];
  std::uint64_t prefix;
  unsigned long long left, total;
  int written;
};

/// One stream's inputs and scratch, as the block sees them, and the steps of its selection in
/// order. Every thread of the block calls each step.
template <class T>
struct HierarchicalBlock {
  HierarchicalDeviceIndex<T> ix;
  const float* q;
  std::int64_t first, end, stride;
  float* est1;      // [group][stride]: the clusters' estimates
  float* est2;      // est1 + clusters: the members' estimates
  unsigned* count;  // each cluster's candidates, then each member's take flag
  std::uint32_t* bitmap;
  std::uint32_t* out;
  int group, head_dim;
  HierarchicalShared& sh;

  __device__ HierarchicalBlock(const HierarchicalSelectParams<T>& p, int s, HierarchicalShared& shared)
      : ix(p.index[s]),
        q(p.q + static_cast<std::int64_t>(s) * p.group * p.head_dim),
        first(p.first_candidate[s]),
        end(p.end_candidate[s]),
        stride(p.scratch_stride),
        est1(p.scratch_est + static_cast<std::int64_t>(s) * p.group * p.scratch_stride),
        est2(est1 + ix.clusters),
        count(p.scratch_count + static_cast<std::int64_t>(s) * p.scratch_stride),
        bitmap(p.scratch_bitmap + static_cast<std::int64_t>(s) * p.bitmap_words),
        out(p.out + static_cast<std::int64_t>(s) * p.max_k),
        group(p.group),
        head_dim(p.head_dim),
        sh(shared) {}

  __device__ std::uint64_t cluster_key(std::int64_t c) const {
    return index::selection_key(index::gqa_page_score(est1 + c, sh.head_max, group, static_cast<std::size_t>(stride)), static_cast<std::uint32_t>(c));
  }
  __device__ std::uint64_t member_key(std::int64_t m) const {
    return index::selection_key(index::gqa_page_score(est2 + m, sh.head_max, group, static_cast<std::size_t>(stride)), ix.member_pages[m]);
  }
  __device__ unsigned long long member_weight(std::int64_t m) const { return count[ix.clusters + m]; }

  /// Each head's reach and |q_pair| on the stream's pairs, and the page bitmap cleared.
  __device__ void prepare(float radius_weight, index::RotaryPairs rotary, std::int64_t bitmap_words) {
    const int d = head_dim, pairs = min(ix.pair_count, kHierarchicalMaxPairs);
    for (int h = threadIdx.x; h < group; h += blockDim.x) {
      float norm = 0;
      for (int j = 0; j < d; ++j) norm += q[h * d + j] * q[h * d + j];
      sh.reach[h] = radius_weight * sqrtf(norm);
      for (int i = 0; i < pairs; ++i) sh.qpair[h * kHierarchicalMaxPairs + i] = index::pair_norm(q + h * d, rotary, ix.pairs[i], d);
    }
    for (std::int64_t w = threadIdx.x; w < bitmap_words; w += blockDim.x) bitmap[w] = 0;
    __syncthreads();
  }

  /// Level 1: the clusters holding candidates, scored per head (NaN marks the others); returns
  /// the key at which the best clusters hold `target` candidate pages.
  __device__ std::uint64_t choose_clusters(unsigned long long target) {
    const int d = head_dim;
    for (std::int64_t c = threadIdx.x; c < ix.clusters; c += blockDim.x) {
      const std::int64_t lo = lower_bound_page(ix.member_pages, ix.member_offsets[c], ix.member_offsets[c + 1], static_cast<std::uint32_t>(first));
      const std::int64_t hi = lower_bound_page(ix.member_pages, lo, ix.member_offsets[c + 1], static_cast<std::uint32_t>(end));
      count[c] = static_cast<unsigned>(hi - lo);
      for (int h = 0; h < group; ++h)
        est1[h * stride + c] = hi > lo ? index::row_dot(q + h * d, ix.centroids + c * d, d) + sh.reach[h] * ix.radius[c] : NAN;
    }
    __syncthreads();
    block_head_max<kHierarchicalThreads>(est1, ix.clusters, stride, group, sh.head_max, sh.temp.reduce);
    return block_radix_threshold(
        ix.clusters, target, [&](std::int64_t c) { return cluster_key(c); },
        [&](std::int64_t c) { return static_cast<unsigned long long>(count[c]); }, sh.hist, sh.prefix, sh.left);
  }

  /// Level 2: the candidate members of the clusters at or above `cut`, scored per head (NaN marks
  /// the rest); returns how many there are.
  __device__ unsigned long long score_members(std::uint64_t cut, float pair_weight) {
    const int d = head_dim, pairs = min(ix.pair_count, kHierarchicalMaxPairs);
    unsigned long long valid = 0;
    for (std::int64_t m = threadIdx.x; m < ix.members; m += blockDim.x) {
      const std::uint32_t c = ix.member_cluster[m], page = ix.member_pages[m];
      const bool take = count[c] > 0 && cluster_key(c) >= cut && page >= first && page < end;
      count[ix.clusters + m] = take;  // the member's weight in the top-k below
      valid += take;
      for (int h = 0; h < group; ++h)
        est2[h * stride + m] = take ? index::row_dot(q + h * d, ix.member_means + m * d, d) +
                                          index::pair_bonus(sh.qpair + h * kHierarchicalMaxPairs, ix.member_radii + m * pairs, pairs, pair_weight)
                                    : NAN;
    }
    const unsigned long long members = cub::BlockReduce<unsigned long long, kHierarchicalThreads>(sh.temp.count).Sum(valid);
    if (threadIdx.x == 0) sh.total = members;
    __syncthreads();
    block_head_max<kHierarchicalThreads>(est2, ix.members, stride, group, sh.head_max, sh.temp.reduce);
    return sh.total;
  }

  /// The k best scored members set their page's bit; then the set pages come out in page order.
  __device__ void write_best(unsigned long long k) {
    const std::uint64_t kth = block_radix_threshold(
        ix.members, k, [&](std::int64_t m) { return member_key(m); }, [&](std::int64_t m) { return member_weight(m); }, sh.hist, sh.prefix, sh.left);
    for (std::int64_t m = threadIdx.x; m < ix.members; m += blockDim.x)
      if (member_weight(m) && member_key(m) >= kth) {
        const std::uint32_t page = ix.member_pages[m];
        atomicOr(&bitmap[page / 32], 1u << (page % 32));
      }
    __syncthreads();
    write_in_order<kHierarchicalThreads>(
        end - first, [&](std::int64_t i) { return ((bitmap[(first + i) / 32] >> ((first + i) % 32)) & 1u) != 0; },
        [&](std::int64_t i) { return static_cast<std::uint32_t>(first + i); }, out, sh.temp.scan, sh.written);
  }
};

}  // namespace detail

template <class T>
__global__ void __launch_bounds__(kHierarchicalThreads) HierarchicalSelectKernel(HierarchicalSelectParams<T> p) {
  __shared__ detail::HierarchicalShared sh;
  const int s = blockIdx.x;
  detail::HierarchicalBlock<T> block(p, s, sh);
  block.prepare(p.radius_weight, p.rotary, p.bitmap_words);
  const std::int64_t budget = max(p.budget[s], std::int64_t{0});
  const std::uint64_t cut = block.choose_clusters(static_cast<unsigned long long>(
      index::members_to_score(p.expand, p.min_scored, p.score_all_below, budget, p.end_candidate[s] - p.first_candidate[s])));
  const auto members = static_cast<std::int64_t>(block.score_members(cut, p.pair_weight));
  const auto k = static_cast<unsigned long long>(min(min(budget, members), static_cast<std::int64_t>(p.max_k)));
  if (k > 0) block.write_best(k);
  if (threadIdx.x == 0 && p.out_count) p.out_count[s] = static_cast<int>(k);
}

/// Checks the arguments and launches HierarchicalSelectKernel on `stream`.
template <class T>
cudaError_t hierarchical_select(const HierarchicalSelectParams<T>& p, cudaStream_t stream = nullptr) {
  if (p.streams < 0 || p.group < 1 || p.group > kHierarchicalMaxGroup || p.head_dim < 1 || p.max_k < 0) return cudaErrorInvalidValue;
  if (!(p.expand >= 1.0) || !std::isfinite(p.expand) || !(p.min_scored >= 0.0 && p.min_scored <= 1.0) || p.score_all_below < 0 ||
      !(p.radius_weight >= 0.0f) || !std::isfinite(p.radius_weight) || !(p.pair_weight >= 0.0f) || !std::isfinite(p.pair_weight))
    return cudaErrorInvalidValue;
  if (p.streams == 0) return cudaSuccess;
  if (!p.index || !p.q || !p.first_candidate || !p.end_candidate || !p.budget || !p.scratch_est || !p.scratch_count || !p.scratch_bitmap ||
      p.scratch_stride < 1 || p.bitmap_words < 1 || (!p.out && p.max_k > 0))
    return cudaErrorInvalidValue;
  HierarchicalSelectKernel<T><<<static_cast<unsigned>(p.streams), kHierarchicalThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
