// Split-KV sparse decode attention on the GPU (Decision 2): each stream's GQA group attends over
// a list of pages given as device pointers (cache slots, in ascending page order; sink, selected
// and local pages alike), and returns the output, the log-sum-exp per head and the log-sum-exp
// of every page per head, as the CPU's KvManager computes them. The arithmetic (element
// conversion, exp, partial merge) is the shared KVD_HOST_DEVICE code of attention/math.hpp.
//
// The split is the CPU's (attention::kSplitPages pages in list order), in two kernels:
//   SparseDecodeSplitKernel  one block per (split, stream), one warp per query head of the
//                            group: each page's K and V rows are staged in shared memory once
//                            and read by every head of the group; each warp folds the split's
//                            pages in order and writes the split's output and log-sum-exp;
//   MergeSplitsKernel        one warp per (stream, head) merges the splits in list order, as
//                            attention::merge_splits does.
// Pages of all streams are one CSR list: stream s owns pages [page_offsets[s], page_offsets[s+1]).
// The split and the merge order depend only on the page list, never on where pages came from,
// so outputs are bitwise the same run to run whatever the cache held (Decision 2's invariant on
// the GPU). Kernels are instantiated per head_dim / 32 so that a lane's row stays in registers.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/cuda/decode_block.cuh"

namespace kvdrive::cuda {

template <class T>
struct SparseDecodeParams {
  const float* q = nullptr;                 ///< [streams][group][head_dim]
  const T* const* page_k = nullptr;         ///< [total pages]: each page's keys, [page_tokens][head_dim]
  const T* const* page_v = nullptr;         ///< [total pages]: its values, same layout
  const int* page_tokens = nullptr;         ///< [total pages]: filled rows of each page (<= max_page_tokens)
  const std::int64_t* page_offsets = nullptr;  ///< [streams + 1]: CSR offsets into the page lists
  float* out = nullptr;                     ///< [streams][group][head_dim]
  float* lse = nullptr;                     ///< [streams][group], optional
  float* page_lse = nullptr;                ///< [total pages][group], optional
  /// Scratch: each split's output [streams][max_splits][group][head_dim] and log-sum-exp
  /// [streams][max_splits][group]; max_splits >= split_count(pages) of every stream.
  float* split_out = nullptr;
  float* split_lse = nullptr;
  int max_splits = 0;
  /// Rows staged in shared memory per page (every page_tokens[i] must be at most this; a larger
  /// page fails the launch). 2 x max_page_tokens x head_dim x sizeof(T) must fit in 48 KiB:
  /// 96 tokens of f16 at head_dim 128, 48 of f32.
  int max_page_tokens = 0;
  int streams = 0, group = 1, head_dim = 0;
  float scale = 1.0f;
};

inline constexpr int kSparseDecodeMaxDim = 256;      // head_dim <= 256, a multiple of 32
inline constexpr int kSparseDecodeMaxGroup = 32;     // a warp per query head, at most 1024 threads
inline constexpr std::size_t kSparseDecodeMaxShared = 48 * 1024;  // K + V rows of one page

template <class T, int PerLane>
__global__ void SparseDecodeSplitKernel(SparseDecodeParams<T> p) {
  extern __shared__ __align__(16) unsigned char stage[];
  T* sk = reinterpret_cast<T*>(stage);
  T* sv = sk + static_cast<std::size_t>(p.max_page_tokens) * p.head_dim;
  const int split = blockIdx.x, stream = blockIdx.y;
  const int head = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int d = PerLane * 32;
  const std::int64_t first = p.page_offsets[stream], pages = p.page_offsets[stream + 1] - first;
  const std::int64_t begin = static_cast<std::int64_t>(split) * static_cast<std::int64_t>(attention::kSplitPages);
  if (begin >= pages) return;  // the whole block leaves: no barrier is skipped
  const std::int64_t end = min(pages, begin + static_cast<std::int64_t>(attention::kSplitPages));

  float qr[PerLane];
  const float* q = p.q + (static_cast<std::int64_t>(stream) * p.group + head) * d;
  for (int i = 0; i < PerLane; ++i) qr[i] = q[lane + 32 * i];
  float m = attention::neg_inf(), l = 0.0f, acc[PerLane] = {};
  for (std::int64_t page = begin; page < end; ++page) {
    const int tokens = p.page_tokens[first + page];
    if (tokens > p.max_page_tokens) __trap();  // would overflow the stage: a launch failure, not wrong output
    const T* k = p.page_k[first + page];
    const T* v = p.page_v[first + page];
    for (int i = threadIdx.x; i < tokens * d; i += blockDim.x) {
      sk[i] = k[i];
      sv[i] = v[i];
    }
    __syncthreads();
    float mp = attention::neg_inf(), lp = 0.0f, accp[PerLane] = {};
    detail::fold_page<T>(qr, sk, sv, tokens, d, PerLane, lane, p.scale, mp, lp, accp);
    if (p.page_lse && lane == 0) p.page_lse[(first + page) * p.group + head] = attention::partial_lse(mp, lp);
    attention::merge_partial(m, l, acc, mp, lp, accp, PerLane);
    __syncthreads();  // the stage is refilled next
  }
  const std::int64_t at = (static_cast<std::int64_t>(stream) * p.max_splits + split) * p.group + head;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int i = 0; i < PerLane; ++i) p.split_out[at * d + lane + 32 * i] = acc[i] * inv;
  if (lane == 0) p.split_lse[at] = attention::partial_lse(m, l);
}

/// One warp per (stream, head): the stream's splits merged in list order (attention::merge_splits).
template <int PerLane>
__global__ void MergeSplitsKernel(const std::int64_t* page_offsets, const float* split_out, const float* split_lse, float* out,
                                  float* lse, int max_splits, int group) {
  const int stream = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
  constexpr int d = PerLane * 32;
  const auto splits = static_cast<int>(attention::split_count(static_cast<std::size_t>(page_offsets[stream + 1] - page_offsets[stream])));
  if (splits > max_splits) __trap();  // the split kernel had no room for them: a launch failure, not wrong output
  float m = attention::neg_inf(), l = 0.0f, acc[PerLane] = {};
  for (int s = 0; s < splits; ++s) {
    const std::int64_t at = (static_cast<std::int64_t>(stream) * max_splits + s) * group + head;
    const float ls = split_lse[at];
    if (ls == attention::neg_inf()) continue;  // a split with no tokens
    float part[PerLane];
    for (int i = 0; i < PerLane; ++i) part[i] = split_out[at * d + lane + 32 * i];
    attention::merge_partial(m, l, acc, ls, 1.0f, part, PerLane);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const std::int64_t o = static_cast<std::int64_t>(stream) * group + head;
  for (int i = 0; i < PerLane; ++i) out[o * d + lane + 32 * i] = acc[i] * inv;
  if (lse && lane == 0) lse[o] = attention::partial_lse(m, l);
}

namespace detail {
template <class T, int PerLane>
cudaError_t launch_sparse_decode(const SparseDecodeParams<T>& p, std::size_t shared, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.max_splits), static_cast<unsigned>(p.streams));
  SparseDecodeSplitKernel<T, PerLane><<<grid, static_cast<unsigned>(p.group) * 32, shared, stream>>>(p);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  MergeSplitsKernel<PerLane><<<dim3(static_cast<unsigned>(p.streams), static_cast<unsigned>(p.group)), 32, 0, stream>>>(
      p.page_offsets, p.split_out, p.split_lse, p.out, p.lse, p.max_splits, p.group);
  return cudaGetLastError();
}
}  // namespace detail

/// Checks the arguments and launches both kernels on `stream`. The page lists must be on the
/// device (or mapped), with every pointer valid for its page_tokens rows.
template <class T>
cudaError_t sparse_decode(const SparseDecodeParams<T>& p, cudaStream_t stream = nullptr) {
  if (p.streams <= 0 || p.streams > 65535 || p.group <= 0 || p.group > kSparseDecodeMaxGroup) return cudaErrorInvalidValue;
  if (p.head_dim <= 0 || p.head_dim > kSparseDecodeMaxDim || p.head_dim % 32 != 0) return cudaErrorInvalidValue;
  if (!p.q || !p.page_k || !p.page_v || !p.page_tokens || !p.page_offsets || !p.out || !p.split_out || !p.split_lse)
    return cudaErrorInvalidValue;
  if (p.max_splits <= 0 || p.max_page_tokens <= 0) return cudaErrorInvalidValue;
  const std::size_t shared = 2 * static_cast<std::size_t>(p.max_page_tokens) * static_cast<std::size_t>(p.head_dim) * sizeof(T);
  if (shared > kSparseDecodeMaxShared) return cudaErrorInvalidValue;
  switch (p.head_dim / 32) {
    case 1: return detail::launch_sparse_decode<T, 1>(p, shared, stream);
    case 2: return detail::launch_sparse_decode<T, 2>(p, shared, stream);
    case 3: return detail::launch_sparse_decode<T, 3>(p, shared, stream);
    case 4: return detail::launch_sparse_decode<T, 4>(p, shared, stream);
    case 5: return detail::launch_sparse_decode<T, 5>(p, shared, stream);
    case 6: return detail::launch_sparse_decode<T, 6>(p, shared, stream);
    case 7: return detail::launch_sparse_decode<T, 7>(p, shared, stream);
    default: return detail::launch_sparse_decode<T, 8>(p, shared, stream);
  }
}

}  // namespace kvdrive::cuda
