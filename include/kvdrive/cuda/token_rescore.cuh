// Token-level rescoring on the GPU (index::TokenRescore's two looks): token_first_look scores
// every candidate page from its coded mean and radii (index::token_first_look), token_rescore
// scores each page of a pool from its 4-bit key copies (index::token_page_estimate), with the
// same KVD_HOST_DEVICE arithmetic as the CPU (index/token_keys.hpp), so the CPU tests cover what
// the kernels compute. One thread per (page, head); est is [group][pages]. The GQA rule and the
// top-k follow on the host or in cuda/top_k.cuh.
//
// The rows are the index's TokenKeys rows copied to the device as one array [pages][row_bytes];
// the pool names which of them to score. cuda::DeviceHierarchical does not call this yet: with
// TokenRescore the CUDA backend selects on the host (docs/cuda.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/index/token_keys.hpp"

namespace kvdrive::cuda {

struct TokenRescoreParams {
  int group = 1, head_dim = 0, page_tokens = 0;
  bool max_token = false;
  const std::int8_t* q8 = nullptr;      ///< [group][head_dim]: the query as TokenKeys::fold_query codes it
  const float* q_scale = nullptr;       ///< [group]
  const int* q_sum = nullptr;           ///< [group]
  const std::uint8_t* rows = nullptr;   ///< [pages][row_bytes]: TokenKeys rows, page id order
  std::size_t row_bytes = 0;            ///< index::token_row_bytes(page_tokens, head_dim)
  const std::uint32_t* pool = nullptr;  ///< [n] page ids to score
  std::int64_t n = 0;
  float* est = nullptr;  ///< [group][n]
};

template <bool MaxToken>
__global__ void TokenRescoreKernel(TokenRescoreParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (i >= p.n) return;
  const std::uint8_t* row = p.rows + static_cast<std::size_t>(p.pool[i]) * p.row_bytes;
  p.est[h * p.n + i] =
      index::token_page_estimate(p.q8 + static_cast<std::size_t>(h) * p.head_dim, p.q_scale[h], p.q_sum[h], row, p.page_tokens, p.head_dim, MaxToken);
}

struct TokenFirstLookParams {
  int group = 1, head_dim = 0, page_tokens = 0;
  const std::int8_t* q8 = nullptr;     ///< [group][head_dim]: the query as TokenKeys::fold_query codes it
  const float* q_scale = nullptr;      ///< [group]
  const int* q_sum = nullptr;          ///< [group]
  const float* pair_w = nullptr;       ///< [group][index::kTokenRadii]
  const std::uint8_t* rows = nullptr;  ///< [pages][row_bytes]: TokenKeys rows, page id order
  std::size_t row_bytes = 0;           ///< index::token_row_bytes(page_tokens, head_dim)
  std::int64_t first = 0, n = 0;       ///< pages [first, first + n): the candidates
  float* est = nullptr;                ///< [group][n]
};

__global__ void TokenFirstLookKernel(TokenFirstLookParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (i >= p.n) return;
  const std::uint8_t* row = p.rows + static_cast<std::size_t>(p.first + i) * p.row_bytes;
  p.est[h * p.n + i] = index::token_first_look(p.q8 + static_cast<std::size_t>(h) * p.head_dim, p.q_scale[h], p.q_sum[h],
                                               p.pair_w + static_cast<std::size_t>(h) * index::kTokenRadii, row, p.page_tokens, p.head_dim);
}

/// Whether a launch over n pages of TokenKeys rows has a shape the kernels take: a grid's worth of
/// heads, whole rows of the layout token_row_bytes gives.
inline bool token_rows_shape_ok(int group, std::int64_t n, int page_tokens, int head_dim, std::size_t row_bytes) {
  return group >= 1 && group <= 65535 && n >= 0 && page_tokens >= 1 && head_dim >= 2 && head_dim % 2 == 0 &&
         row_bytes == index::token_row_bytes(page_tokens, head_dim);
}

/// The first look at pages [first, first + n) for every head of the group; checks its arguments.
inline cudaError_t token_first_look(const TokenFirstLookParams& p, cudaStream_t stream = nullptr) {
  if (!token_rows_shape_ok(p.group, p.n, p.page_tokens, p.head_dim, p.row_bytes) || p.first < 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (!p.q8 || !p.q_scale || !p.q_sum || !p.pair_w || !p.rows || !p.est) return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((p.n + kThreads - 1) / kThreads), static_cast<unsigned>(p.group));
  TokenFirstLookKernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

/// Scores the pool's pages for every head of the group; checks its arguments.
inline cudaError_t token_rescore(const TokenRescoreParams& p, cudaStream_t stream = nullptr) {
  if (!token_rows_shape_ok(p.group, p.n, p.page_tokens, p.head_dim, p.row_bytes)) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (!p.q8 || !p.q_scale || !p.q_sum || !p.rows || !p.pool || !p.est) return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((p.n + kThreads - 1) / kThreads), static_cast<unsigned>(p.group));
  if (p.max_token) TokenRescoreKernel<true><<<grid, kThreads, 0, stream>>>(p);
  else TokenRescoreKernel<false><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
