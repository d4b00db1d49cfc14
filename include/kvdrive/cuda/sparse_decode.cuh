// Split-KV sparse decode attention on the GPU (Decision 2): each stream's GQA group attends over
// a list of pages given as device pointers (cache slots, in ascending page order; sink, selected
// and local pages alike), and returns the output, the log-sum-exp per head and the log-sum-exp
// of every page per head, as the CPU's KvManager computes them. The arithmetic (element
// conversion, exp, partial merge) is the shared KVD_HOST_DEVICE code of attention/math.hpp.
//
// The split is the CPU's (attention::kSplitPages pages in list order), in two kernels:
//   SparseDecodeSplitKernel  one block per (split, stream), one warp per query head of the
//                            group: the split's pages' K and V rows are staged in shared memory
//                            (stage_pages at a time, all of the split where they fit, in 16-byte
//                            words, so that their loads are in flight together) and read by every
//                            head of the group; each warp folds the split's pages in order and
//                            writes the split's output and log-sum-exp;
//   MergeSplitsKernel        one warp per (stream, head) merges the splits in list order, as
//                            attention::merge_splits does.
// Pages of all streams are one CSR list: stream s owns pages [page_offsets[s], page_offsets[s+1]).
// The split and the merge order depend only on the page list, never on where pages came from,
// so outputs are bitwise the same run to run whatever the cache held (Decision 2's invariant on
// the GPU). Kernels are instantiated per head_dim / 32 so that a lane's row stays in registers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/cuda/decode_block.cuh"

namespace kvdrive::cuda {

template <class T>
struct SparseDecodeParams {
  const float* q = nullptr;                    ///< [streams][group][head_dim]
  const T* const* page_k = nullptr;            ///< [total pages]: each page's keys, [page_tokens][head_dim]
  const T* const* page_v = nullptr;            ///< [total pages]: its values, same layout
  const int* page_tokens = nullptr;            ///< [total pages]: filled rows of each page (<= max_page_tokens)
  const std::int64_t* page_offsets = nullptr;  ///< [streams + 1]: CSR offsets into the page lists
  float* out = nullptr;                        ///< [streams][group][head_dim]
  float* lse = nullptr;                        ///< [streams][group], optional
  float* page_lse = nullptr;                   ///< [total pages][group], optional
  /// Scratch: each split's output [streams][max_splits][group][head_dim] and log-sum-exp
  /// [streams][max_splits][group]; max_splits >= split_count(pages) of every stream.
  float* split_out = nullptr;
  float* split_lse = nullptr;
  int max_splits = 0;
  /// Rows staged in shared memory per page (every page_tokens[i] must be at most this; a larger
  /// page fails the launch). 2 x max_page_tokens x head_dim x sizeof(T) must fit in 48 KiB:
  /// 96 tokens of f16 at head_dim 128, 48 of f32.
  int max_page_tokens = 0;
  /// Pages staged in shared memory at once: 0, as many as fit in 48 KiB (up to a split's
  /// attention::kSplitPages); 1, one page at a time, element by element (the first kernel's way,
  /// kept to measure against). The fold order, and so the output, is the same either way.
  int stage_pages = 0;
  int streams = 0, group = 1, head_dim = 0;
  float scale = 1.0f;
};

inline constexpr int kSparseDecodeMaxDim = 256;                   // head_dim <= 256, a multiple of 32
inline constexpr int kSparseDecodeMaxGroup = 32;                  // a warp per query head, at most 1024 threads
inline constexpr std::size_t kSparseDecodeMaxShared = 48 * 1024;  // K + V rows of one page

/// Shared-memory bytes one staged page takes: its K and V rows, max_page_tokens each.
inline std::size_t sparse_decode_page_stage_bytes(int max_page_tokens, int head_dim, std::size_t element_bytes) {
  return 2 * static_cast<std::size_t>(max_page_tokens) * static_cast<std::size_t>(head_dim) * element_bytes;
}

/// Pages staged at once for a launch: the params' stage_pages, or (0) as many as fit.
/// Never more than fit in kSparseDecodeMaxShared, nor than a split holds, nor fewer than one.
inline int sparse_decode_stage_pages(int stage_pages, std::size_t page_stage_bytes) {
  const std::size_t fit = std::clamp<std::size_t>(page_stage_bytes ? kSparseDecodeMaxShared / page_stage_bytes : 1, 1, attention::kSplitPages);
  return static_cast<int>(stage_pages > 0 ? std::min(static_cast<std::size_t>(stage_pages), fit) : fit);
}

namespace detail {

/// Stages pages [c0, c1) of a stream (CSR index `first`) into shared memory: page j's K rows at
/// stage + 2j x page_elems, its V rows after them. Pages whose K and V start 16-byte aligned move
/// in 16-byte words, four loads in flight per thread before their stores; any other page element
/// by element. Every thread of the block calls it; the caller synchronises after.
template <class T>
__device__ void stage_split_pages(const SparseDecodeParams<T>& p, std::int64_t first, std::int64_t c0, std::int64_t c1, T* stage,
                                  std::int64_t page_elems) {
  const std::int64_t wpp = page_elems * static_cast<std::int64_t>(sizeof(T)) / 16;  // words per K (or V) block
  const std::int64_t total = (c1 - c0) * 2 * wpp;
  const auto aligned = [&](std::int64_t page) {
    return reinterpret_cast<std::uintptr_t>(p.page_k[first + page]) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.page_v[first + page]) % 16 == 0;
  };
  constexpr int kBatch = 4;
  for (std::int64_t w0 = threadIdx.x; w0 < total; w0 += static_cast<std::int64_t>(blockDim.x) * kBatch) {
    uint4 r[kBatch];
    uint4* to[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      to[b] = nullptr;
      const std::int64_t w = w0 + static_cast<std::int64_t>(b) * blockDim.x;
      if (w >= total) continue;
      const std::int64_t j = w / (2 * wpp), rest = w % (2 * wpp), kv = rest / wpp, off = rest % wpp, page = c0 + j;
      const std::int64_t bytes = static_cast<std::int64_t>(p.page_tokens[first + page]) * p.head_dim * static_cast<std::int64_t>(sizeof(T));
      if (off * 16 >= bytes || !aligned(page)) continue;
      const T* src = kv ? p.page_v[first + page] : p.page_k[first + page];
      r[b] = reinterpret_cast<const uint4*>(src)[off];
      to[b] = reinterpret_cast<uint4*>(stage + (2 * j + kv) * page_elems) + off;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (to[b]) *to[b] = r[b];
  }
  for (std::int64_t page = c0; page < c1; ++page) {  // the rare unaligned page
    if (aligned(page)) continue;
    const std::int64_t n = static_cast<std::int64_t>(p.page_tokens[first + page]) * p.head_dim;
    T* dk = stage + 2 * (page - c0) * page_elems;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      dk[i] = p.page_k[first + page][i];
      dk[page_elems + i] = p.page_v[first + page][i];
    }
  }
}

}  // namespace detail

template <class T, int PerLane>
__global__ void SparseDecodeSplitKernel(SparseDecodeParams<T> p) {
  extern __shared__ __align__(16) unsigned char stage[];
  T* sk = reinterpret_cast<T*>(stage);
  T* sv = sk + static_cast<std::size_t>(p.max_page_tokens) * p.head_dim;  // stage_pages 1: one page's V rows
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
  for (std::int64_t page = begin; page < end; ++page)
    if (p.page_tokens[first + page] > p.max_page_tokens) __trap();  // would overflow the stage: a launch failure, not wrong output
  const std::int64_t page_elems = static_cast<std::int64_t>(p.max_page_tokens) * d;
  const auto fold = [&](std::int64_t page, const T* k, const T* v) {
    float mp = attention::neg_inf(), lp = 0.0f, accp[PerLane] = {};
    detail::fold_page<T>(qr, k, v, p.page_tokens[first + page], d, PerLane, lane, p.scale, mp, lp, accp);
    if (p.page_lse && lane == 0) p.page_lse[(first + page) * p.group + head] = attention::partial_lse(mp, lp);
    attention::merge_partial(m, l, acc, mp, lp, accp, PerLane);
  };
  if (p.stage_pages == 1) {  // one page at a time, element by element
    for (std::int64_t page = begin; page < end; ++page) {
      const int tokens = p.page_tokens[first + page];
      const T* k = p.page_k[first + page];
      const T* v = p.page_v[first + page];
      for (int i = threadIdx.x; i < tokens * d; i += blockDim.x) {
        sk[i] = k[i];
        sv[i] = v[i];
      }
      __syncthreads();
      fold(page, sk, sv);
      __syncthreads();  // the stage is refilled next
    }
  } else {
    const std::int64_t step = max(1, p.stage_pages);  // the launcher sets it; never loop forever on 0
    for (std::int64_t c0 = begin; c0 < end; c0 += step) {
      const std::int64_t c1 = min(end, c0 + step);
      detail::stage_split_pages(p, first, c0, c1, sk, page_elems);
      __syncthreads();
      for (std::int64_t page = c0; page < c1; ++page) {
        const T* k = sk + 2 * (page - c0) * page_elems;
        fold(page, k, k + page_elems);
      }
      __syncthreads();  // the stage is refilled next
    }
  }
  const std::int64_t at = (static_cast<std::int64_t>(stream) * p.max_splits + split) * p.group + head;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int i = 0; i < PerLane; ++i) p.split_out[at * d + lane + 32 * i] = acc[i] * inv;
  if (lane == 0) p.split_lse[at] = attention::partial_lse(m, l);
}

/// One warp per (stream, head): the stream's splits merged in list order (attention::merge_splits).
template <int PerLane>
__global__ void MergeSplitsKernel(const std::int64_t* page_offsets, const float* split_out, const float* split_lse, float* out, float* lse,
                                  int max_splits, int group) {
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
  if (!p.q || !p.page_k || !p.page_v || !p.page_tokens || !p.page_offsets || !p.out || !p.split_out || !p.split_lse) return cudaErrorInvalidValue;
  if (p.max_splits <= 0 || p.max_page_tokens <= 0 || p.stage_pages < 0) return cudaErrorInvalidValue;
  const std::size_t page_bytes = sparse_decode_page_stage_bytes(p.max_page_tokens, p.head_dim, sizeof(T));
  if (page_bytes > kSparseDecodeMaxShared) return cudaErrorInvalidValue;
  SparseDecodeParams<T> q = p;
  q.stage_pages = sparse_decode_stage_pages(p.stage_pages, page_bytes);
  const std::size_t shared = page_bytes * static_cast<std::size_t>(q.stage_pages);
  switch (p.head_dim / 32) {
    case 1: return detail::launch_sparse_decode<T, 1>(q, shared, stream);
    case 2: return detail::launch_sparse_decode<T, 2>(q, shared, stream);
    case 3: return detail::launch_sparse_decode<T, 3>(q, shared, stream);
    case 4: return detail::launch_sparse_decode<T, 4>(q, shared, stream);
    case 5: return detail::launch_sparse_decode<T, 5>(q, shared, stream);
    case 6: return detail::launch_sparse_decode<T, 6>(q, shared, stream);
    case 7: return detail::launch_sparse_decode<T, 7>(q, shared, stream);
    default: return detail::launch_sparse_decode<T, 8>(q, shared, stream);
  }
}

}  // namespace kvdrive::cuda
