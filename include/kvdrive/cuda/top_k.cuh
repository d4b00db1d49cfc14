// Top-k page selection per stream on the GPU, after page scoring (page_scores.cuh): from each
// head's estimates of a stream's candidate pages, the GQA page score (Decision 4,
// index::gqa_page_score), then the k best pages as ascending page ids, exactly as the CPU's
// index::top_pages chooses them (ties to the lower page id, NaN lowest), through the shared
// index::selection_key, whose k largest values are that choice.
//
// One block per stream. Up to kTopKSortCapacity candidates, the block sorts the keys with CUB's
// BlockRadixSort and keeps the first k; with more, a radix select (index/radix_select.hpp) finds
// the k-th largest key in eight passes of 8 bits over the candidates (a shared 256-bin
// histogram per pass), and one
// more pass writes the pages at or above it, in page order (a block scan gives each its place).
#pragma once

#include <cstdint>

#include <cub/block/block_radix_sort.cuh>
#include <cuda_runtime.h>

#include "kvdrive/cuda/block_select.cuh"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::cuda {

struct TopKParams {
  const float* est = nullptr;                ///< [streams][group][stride]: each head's estimates of the candidates
  std::int64_t stride = 0;                   ///< elements between two heads' rows (>= every stream's candidates)
  const int* candidates = nullptr;           ///< [streams]: candidate pages of each stream (<= stride)
  const int* k = nullptr;                    ///< [streams]: pages to select (clamped to the candidates)
  const std::int64_t* first_page = nullptr;  ///< [streams]: the page id of candidate 0
  std::uint32_t* out = nullptr;              ///< [streams][max_k]: ascending page ids (past max_k: the best max_k)
  int* out_count = nullptr;                  ///< [streams], optional: how many ids each stream got (k, or max_k if smaller)
  int streams = 0, group = 1, max_k = 0;
};

inline constexpr int kTopKThreads = 256;
inline constexpr int kTopKItems = 8;
inline constexpr int kTopKSortCapacity = kTopKThreads * kTopKItems;
inline constexpr int kTopKMaxGroup = 64;

namespace detail {

using TopKSortKeys = cub::BlockRadixSort<std::uint64_t, kTopKThreads, kTopKItems>;
using TopKSortIds = cub::BlockRadixSort<std::uint32_t, kTopKThreads, kTopKItems>;

/// The kernel's shared memory: one union of CUB's scratch (its stages use one at a time), the
/// heads' maxima and the radix select's histogram and state.
struct TopKShared {
  union Temp {
    MaxReduce<kTopKThreads>::TempStorage reduce;
    TopKSortKeys::TempStorage keys;
    TopKSortIds::TempStorage ids;
    OrderScan<kTopKThreads>::TempStorage scan;
  } temp;
  float head_max[kTopKMaxGroup];
  unsigned long long hist[256];
  std::uint64_t prefix;
  unsigned long long left;
  int written;
};

/// Up to kTopKSortCapacity candidates: the block sorts the keys, and ranks [0, k) are the
/// choice, written as ascending page ids.
template <class KeyOf>
__device__ void sort_top_k(int n, int k, KeyOf key_of, std::uint32_t first_page, std::uint32_t* out, TopKShared& sh) {
  const int tid = threadIdx.x;
  std::uint64_t keys[kTopKItems];
  for (int j = 0; j < kTopKItems; ++j) {
    const int i = tid * kTopKItems + j;
    keys[j] = i < n ? key_of(i) : 0;  // padding sorts last (real keys are > 0)
  }
  TopKSortKeys(sh.temp.keys).SortDescending(keys);
  __syncthreads();
  std::uint32_t ids[kTopKItems];
  for (int j = 0; j < kTopKItems; ++j) {
    const int rank = tid * kTopKItems + j;
    ids[j] = rank < k ? first_page + (0xFFFFFFFFu - static_cast<std::uint32_t>(keys[j])) : 0xFFFFFFFFu;
  }
  TopKSortIds(sh.temp.ids).Sort(ids);
  for (int j = 0; j < kTopKItems; ++j) {
    const int rank = tid * kTopKItems + j;
    if (rank < k) out[rank] = ids[j];
  }
}

/// More candidates: the k-th largest key by radix select (keys are unique: exactly k are >= it),
/// then those candidates in page order.
template <class KeyOf>
__device__ void radix_top_k(int n, int k, KeyOf key_of, std::uint32_t first_page, std::uint32_t* out, TopKShared& sh) {
  const std::uint64_t threshold = block_radix_threshold(
      n, static_cast<unsigned long long>(k), key_of, [](std::int64_t) { return 1ull; }, sh.hist, sh.prefix, sh.left);
  write_in_order<kTopKThreads>(
      n, [&](std::int64_t i) { return key_of(i) >= threshold; }, [&](std::int64_t i) { return first_page + static_cast<std::uint32_t>(i); }, out,
      sh.temp.scan, sh.written);
}

}  // namespace detail

__global__ void __launch_bounds__(kTopKThreads) TopKKernel(TopKParams p) {
  __shared__ detail::TopKShared sh;
  const int s = blockIdx.x;
  const int n = max(p.candidates[s], 0);
  const int k = min(min(max(p.k[s], 0), n), p.max_k);  // beyond max_k: cut (out_count says so)
  const float* est = p.est + static_cast<std::int64_t>(s) * p.group * p.stride;
  std::uint32_t* out = p.out + static_cast<std::int64_t>(s) * p.max_k;
  const auto first_page = static_cast<std::uint32_t>(p.first_page[s]);

  detail::block_head_max<kTopKThreads>(est, n, p.stride, p.group, sh.head_max, sh.temp.reduce);
  const auto key_of = [&](std::int64_t i) {
    return index::selection_key(index::gqa_page_score(est + i, sh.head_max, p.group, static_cast<std::size_t>(p.stride)),
                                static_cast<std::uint32_t>(i));
  };
  if (n <= kTopKSortCapacity) detail::sort_top_k(n, k, key_of, first_page, out, sh);
  else if (k > 0) detail::radix_top_k(n, k, key_of, first_page, out, sh);
  if (p.out_count && threadIdx.x == 0) p.out_count[s] = k;
}

/// Checks the arguments and launches TopKKernel on `stream`.
inline cudaError_t top_k(const TopKParams& p, cudaStream_t stream = nullptr) {
  if (p.streams < 0 || p.group < 1 || p.group > kTopKMaxGroup || p.max_k < 0 || p.stride < 0) return cudaErrorInvalidValue;
  if (p.streams == 0) return cudaSuccess;
  if (!p.est || !p.candidates || !p.k || !p.first_page || (!p.out && p.max_k > 0)) return cudaErrorInvalidValue;
  TopKKernel<<<static_cast<unsigned>(p.streams), kTopKThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
