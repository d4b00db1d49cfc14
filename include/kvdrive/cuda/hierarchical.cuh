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
};

/// One stream's flat index in device memory (T: the KV dtype the index stores).
template <class T>
class HierarchicalOnDevice {
 public:
  explicit HierarchicalOnDevice(const index::HierarchicalFlat& f)
      : centroids_(as_span(checked(f).centroids)),
        means_(as_span(f.member_means)),
        radius_(std::span<const float>(f.radius)),
        offsets_(std::span<const std::int64_t>(f.member_offsets)),
        pages_(std::span<const std::uint32_t>(f.member_pages)),
        cluster_(std::span<const std::uint32_t>(f.member_cluster)),
        clusters_(f.clusters()),
        members_(f.members()) {}

  HierarchicalDeviceIndex<T> view() const {
    return {centroids_.data(), radius_.data(), offsets_.data(), pages_.data(), means_.data(), cluster_.data(), clusters_, members_};
  }

 private:
  static const index::HierarchicalFlat& checked(const index::HierarchicalFlat& f) {
    KVD_EXPECT(f.dtype == dtype_of<T>, "HierarchicalOnDevice: the index holds {} data, not {}", dtype_name(f.dtype), dtype_name(dtype_of<T>));
    return f;
  }
  static std::span<const T> as_span(const std::vector<std::byte>& bytes) {
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
  DeviceBuffer<T> centroids_, means_;
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
  double expand = 4.0;
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
  int* out_count = nullptr;      ///< [streams]: ids written
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


template <class T>
__global__ void __launch_bounds__(kHierarchicalThreads) HierarchicalSelectKernel(HierarchicalSelectParams<T> p) {
  using Reduce = cub::BlockReduce<float, kHierarchicalThreads>;
  using Count = cub::BlockReduce<unsigned long long, kHierarchicalThreads>;
  using Scan = detail::OrderScan<kHierarchicalThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Count::TempStorage count;
    typename Scan::TempStorage scan;
  } temp;
  __shared__ float reach[kHierarchicalMaxGroup], head_max[kHierarchicalMaxGroup];
  __shared__ unsigned long long hist[256];
  __shared__ std::uint64_t s_prefix;
  __shared__ unsigned long long s_left, s_total;
  __shared__ int s_written;

  const int s = blockIdx.x, tid = threadIdx.x, g = p.group, d = p.head_dim;
  const HierarchicalDeviceIndex<T> ix = p.index[s];
  const float* q = p.q + static_cast<std::int64_t>(s) * g * d;
  const std::int64_t first = p.first_candidate[s], end = p.end_candidate[s];
  const std::int64_t stride = p.scratch_stride;
  float* est1 = p.scratch_est + static_cast<std::int64_t>(s) * g * stride;  // [g][stride]: clusters first
  float* est2 = est1 + ix.clusters;                                       // then members
  unsigned* count = p.scratch_count + static_cast<std::int64_t>(s) * stride;
  std::uint32_t* bitmap = p.scratch_bitmap + static_cast<std::int64_t>(s) * p.bitmap_words;
  std::uint32_t* out = p.out + static_cast<std::int64_t>(s) * p.max_k;

  for (int h = tid; h < g; h += blockDim.x) {
    float norm = 0;
    for (int j = 0; j < d; ++j) norm += q[h * d + j] * q[h * d + j];
    reach[h] = p.radius_weight * sqrtf(norm);
  }
  for (std::int64_t w = tid; w < p.bitmap_words; w += blockDim.x) bitmap[w] = 0;
  __syncthreads();

  // Level 1: the clusters holding candidates, scored per head; NaN marks the others.
  for (std::int64_t c = tid; c < ix.clusters; c += blockDim.x) {
    const std::int64_t lo = lower_bound_page(ix.member_pages, ix.member_offsets[c], ix.member_offsets[c + 1], static_cast<std::uint32_t>(first));
    const std::int64_t hi = lower_bound_page(ix.member_pages, lo, ix.member_offsets[c + 1], static_cast<std::uint32_t>(end));
    count[c] = static_cast<unsigned>(hi - lo);
    for (int h = 0; h < g; ++h)
      est1[h * stride + c] = hi > lo ? index::row_dot(q + h * d, ix.centroids + c * d, d) + reach[h] * ix.radius[c] : NAN;
  }
  __syncthreads();
  const auto block_max = [&](const float* est, std::int64_t n) {
    for (int h = 0; h < g; ++h) {
      float m = -INFINITY;
      for (std::int64_t i = tid; i < n; i += blockDim.x) {
        const float e = est[h * stride + i];
        m = e > m ? e : m;
      }
      const float all = Reduce(temp.reduce).Reduce(m, [](float a, float b) { return b > a ? b : a; });
      if (tid == 0) head_max[h] = all;
      __syncthreads();
    }
  };
  block_max(est1, ix.clusters);
  const auto cluster_key = [&](std::int64_t c) {
    return index::selection_key(index::gqa_page_score(est1 + c, head_max, g, static_cast<std::size_t>(stride)), static_cast<std::uint32_t>(c));
  };
  const std::int64_t budget = max(p.budget[s], std::int64_t{0});
  const auto target = static_cast<unsigned long long>(ceil(p.expand * static_cast<double>(budget)));
  const std::uint64_t cut = detail::block_radix_threshold(
      ix.clusters, target, cluster_key, [&](std::int64_t c) { return static_cast<unsigned long long>(count[c]); }, hist, s_prefix, s_left);

  // Level 2: the candidate members of the chosen clusters, scored per head; NaN marks the rest.
  unsigned long long valid = 0;
  for (std::int64_t m = tid; m < ix.members; m += blockDim.x) {
    const std::uint32_t c = ix.member_cluster[m], page = ix.member_pages[m];
    const bool take = count[c] > 0 && cluster_key(c) >= cut && page >= first && page < end;
    count[ix.clusters + m] = take;  // the member's weight in the top-k below
    valid += take;
    for (int h = 0; h < g; ++h) est2[h * stride + m] = take ? index::row_dot(q + h * d, ix.member_means + m * d, d) : NAN;
  }
  const unsigned long long members = Count(temp.count).Sum(valid);
  if (tid == 0) s_total = members;
  __syncthreads();
  block_max(est2, ix.members);
  const auto k = static_cast<unsigned long long>(min(min(budget, static_cast<std::int64_t>(s_total)), static_cast<std::int64_t>(p.max_k)));
  const auto member_key = [&](std::int64_t m) {
    return index::selection_key(index::gqa_page_score(est2 + m, head_max, g, static_cast<std::size_t>(stride)), ix.member_pages[m]);
  };
  const auto member_weight = [&](std::int64_t m) { return static_cast<unsigned long long>(count[ix.clusters + m]); };
  if (k > 0) {
    const std::uint64_t kth = detail::block_radix_threshold(ix.members, k, member_key, member_weight, hist, s_prefix, s_left);
    for (std::int64_t m = tid; m < ix.members; m += blockDim.x)
      if (member_weight(m) && member_key(m) >= kth) {
        const std::uint32_t page = ix.member_pages[m];
        atomicOr(&bitmap[page / 32], 1u << (page % 32));
      }
  }
  __syncthreads();
  // Out in page order: the candidate pages whose bit is set.
  if (k > 0)
    detail::write_in_order<kHierarchicalThreads>(
        end - first, [&](std::int64_t i) { return ((bitmap[(first + i) / 32] >> ((first + i) % 32)) & 1u) != 0; },
        [&](std::int64_t i) { return static_cast<std::uint32_t>(first + i); }, out, temp.scan, s_written);
  if (tid == 0 && p.out_count) p.out_count[s] = static_cast<int>(k);
}

/// Checks the arguments and launches HierarchicalSelectKernel on `stream`.
template <class T>
cudaError_t hierarchical_select(const HierarchicalSelectParams<T>& p, cudaStream_t stream = nullptr) {
  if (p.streams < 0 || p.group < 1 || p.group > kHierarchicalMaxGroup || p.head_dim < 1 || p.max_k < 0) return cudaErrorInvalidValue;
  if (!(p.expand >= 1.0) || !std::isfinite(p.expand) || !(p.radius_weight >= 0.0f) || !std::isfinite(p.radius_weight))
    return cudaErrorInvalidValue;
  if (p.streams == 0) return cudaSuccess;
  if (!p.index || !p.q || !p.first_candidate || !p.end_candidate || !p.budget || !p.scratch_est || !p.scratch_count ||
      !p.scratch_bitmap || p.scratch_stride < 1 || p.bitmap_words < 1 || (!p.out && p.max_k > 0))
    return cudaErrorInvalidValue;
  HierarchicalSelectKernel<T><<<static_cast<unsigned>(p.streams), kHierarchicalThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
