// Dense decode attention on the GPU, the first kernel of the CUDA backend: each stream's GQA
// group attends over all of the stream's tokens, split into pages of page_tokens, and returns
// the output, the log-sum-exp per head and the log-sum-exp per page (as the CPU's
// attention::sparse_decode does). The arithmetic (element conversion, exp, partial merge) is the
// shared KVD_HOST_DEVICE code of attention/math.hpp and core/half.hpp.
//
// One block per (stream, query head), kWarps warps. Warp w folds pages w, w + kWarps, ... into
// its partial in ascending order; the warps' partials then merge in warp order. The order is
// fixed, so results are deterministic run to run.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/cuda/decode_block.cuh"

namespace kvdrive::cuda {

template <class T>
struct DenseDecodeParams {
  const float* q = nullptr;     ///< [streams][group][head_dim]
  const T* k = nullptr;         ///< [streams] x kv_stride elements: [tokens][head_dim] each
  const T* v = nullptr;         ///< same layout as k
  const int* tokens = nullptr;  ///< [streams] tokens of each stream
  std::int64_t kv_stride = 0;   ///< elements between streams in k and v
  float* out = nullptr;         ///< [streams][group][head_dim]
  float* lse = nullptr;         ///< [streams][group], optional
  float* page_lse = nullptr;    ///< [streams][max_pages][group], optional
  int streams = 0, group = 1, head_dim = 0, page_tokens = 1, max_pages = 0;
  float scale = 1.0f;
};

inline constexpr int kDenseDecodeWarps = 4;
inline constexpr int kDenseDecodeMaxDim = 256;  // head_dim <= 256, a multiple of 32

template <class T>
__global__ void DenseDecodeKernel(DenseDecodeParams<T> p) {
  constexpr int kPerLane = kDenseDecodeMaxDim / 32;
  const int stream = blockIdx.x, head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = p.head_dim, per_lane = d / 32;
  const float* q = p.q + (static_cast<std::int64_t>(stream) * p.group + head) * d;
  const T* k = p.k + stream * p.kv_stride;
  const T* v = p.v + stream * p.kv_stride;
  const int tokens = p.tokens[stream];
  const int pages = (tokens + p.page_tokens - 1) / p.page_tokens;

  float qr[kPerLane];
  for (int i = 0; i < per_lane; ++i) qr[i] = q[lane + 32 * i];

  float m = attention::neg_inf(), l = 0.0f, acc[kPerLane] = {};
  for (int page = warp; page < pages; page += kDenseDecodeWarps) {
    const int first = page * p.page_tokens;
    const int last = min(tokens, first + p.page_tokens);
    float mp = attention::neg_inf(), lp = 0.0f, accp[kPerLane] = {};
    detail::fold_page<T>(qr, k + static_cast<std::int64_t>(first) * d, v + static_cast<std::int64_t>(first) * d, last - first, d, per_lane, lane,
                         p.scale, mp, lp, accp);
    if (p.page_lse && lane == 0)
      p.page_lse[(static_cast<std::int64_t>(stream) * p.max_pages + page) * p.group + head] = attention::partial_lse(mp, lp);
    attention::merge_partial(m, l, acc, mp, lp, accp, per_lane);
  }

  detail::merge_warps_and_store<kDenseDecodeWarps, kDenseDecodeMaxDim>(m, l, acc, per_lane,
                                                                       p.out + (static_cast<std::int64_t>(stream) * p.group + head) * d,
                                                                       p.lse ? p.lse + static_cast<std::int64_t>(stream) * p.group + head : nullptr);
}

/// Checks the arguments and launches DenseDecodeKernel on `stream`.
template <class T>
cudaError_t dense_decode(const DenseDecodeParams<T>& p, cudaStream_t stream = nullptr) {
  if (p.streams <= 0 || p.group <= 0 || p.page_tokens <= 0) return cudaErrorInvalidValue;
  if (p.head_dim <= 0 || p.head_dim > kDenseDecodeMaxDim || p.head_dim % 32 != 0) return cudaErrorInvalidValue;
  if (!p.q || !p.k || !p.v || !p.tokens || !p.out) return cudaErrorInvalidValue;
  if (p.page_lse && p.max_pages <= 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.streams), static_cast<unsigned>(p.group));
  DenseDecodeKernel<T><<<grid, kDenseDecodeWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
