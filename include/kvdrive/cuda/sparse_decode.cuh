// Split-KV sparse decode attention on the GPU (Decision 2): each stream's GQA group attends over
// a list of pages given as device pointers (cache slots, in ascending page order; sink, selected
// and local pages alike), and returns the output, the log-sum-exp per head and the log-sum-exp
// of every page per head, as the CPU's attention::sparse_decode does. The arithmetic (element
// conversion, exp, partial merge) is the shared KVD_HOST_DEVICE code of attention/math.hpp.
//
// Pages of all streams are one CSR list: stream s owns pages [page_offsets[s], page_offsets[s+1]).
// One block per (stream, query head), kSparseDecodeWarps warps: warp w folds the stream's pages
// w, w + warps, ... in ascending order into its partial (each page's own partial first, whose
// log-sum-exp is the page's), and the warps' partials merge in warp order. The split and the
// merge order depend only on the page list, never on where pages came from, so outputs are
// bitwise the same run to run whatever the cache held (Decision 2's invariant on the GPU).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/cuda/decode_block.cuh"

namespace kvdrive::cuda {

template <class T>
struct SparseDecodeParams {
  const float* q = nullptr;                 ///< [streams][group][head_dim]
  const T* const* page_k = nullptr;         ///< [total pages]: each page's keys, [page_tokens][head_dim]
  const T* const* page_v = nullptr;         ///< [total pages]: its values, same layout
  const int* page_tokens = nullptr;         ///< [total pages]: filled rows of each page
  const std::int64_t* page_offsets = nullptr;  ///< [streams + 1]: CSR offsets into the page lists
  float* out = nullptr;                     ///< [streams][group][head_dim]
  float* lse = nullptr;                     ///< [streams][group], optional
  float* page_lse = nullptr;                ///< [total pages][group], optional
  int streams = 0, group = 1, head_dim = 0;
  float scale = 1.0f;
};

inline constexpr int kSparseDecodeWarps = 4;
inline constexpr int kSparseDecodeMaxDim = 256;  // head_dim <= 256, a multiple of 32

template <class T>
__global__ void SparseDecodeKernel(SparseDecodeParams<T> p) {
  constexpr int kPerLane = kSparseDecodeMaxDim / 32;
  const int stream = blockIdx.x, head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = p.head_dim, per_lane = d / 32;
  const float* q = p.q + (static_cast<std::int64_t>(stream) * p.group + head) * d;
  const std::int64_t first = p.page_offsets[stream], pages = p.page_offsets[stream + 1] - first;

  float qr[kPerLane];
  for (int i = 0; i < per_lane; ++i) qr[i] = q[lane + 32 * i];

  float m = attention::neg_inf(), l = 0.0f, acc[kPerLane] = {};
  for (std::int64_t page = warp; page < pages; page += kSparseDecodeWarps) {
    const T* k = p.page_k[first + page];
    const T* v = p.page_v[first + page];
    const int tokens = p.page_tokens[first + page];
    float mp = attention::neg_inf(), lp = 0.0f, accp[kPerLane] = {};
    detail::fold_page<T>(qr, k, v, tokens, d, per_lane, lane, p.scale, mp, lp, accp);
    if (p.page_lse && lane == 0) p.page_lse[(first + page) * p.group + head] = attention::partial_lse(mp, lp);
    attention::merge_partial(m, l, acc, mp, lp, accp, per_lane);
  }

  detail::merge_warps_and_store<kSparseDecodeWarps, kSparseDecodeMaxDim>(
      m, l, acc, per_lane, p.out + (static_cast<std::int64_t>(stream) * p.group + head) * d,
      p.lse ? p.lse + static_cast<std::int64_t>(stream) * p.group + head : nullptr);
}

/// Checks the arguments and launches SparseDecodeKernel on `stream`. The page lists must be on
/// the device (or mapped), with every pointer valid for page_tokens rows.
template <class T>
cudaError_t sparse_decode(const SparseDecodeParams<T>& p, cudaStream_t stream = nullptr) {
  if (p.streams <= 0 || p.streams > (1 << 30) || p.group <= 0 || p.group > 65535) return cudaErrorInvalidValue;
  if (p.head_dim <= 0 || p.head_dim > kSparseDecodeMaxDim || p.head_dim % 32 != 0) return cudaErrorInvalidValue;
  if (!p.q || !p.page_k || !p.page_v || !p.page_tokens || !p.page_offsets || !p.out) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.streams), static_cast<unsigned>(p.group));
  SparseDecodeKernel<T><<<grid, kSparseDecodeWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
