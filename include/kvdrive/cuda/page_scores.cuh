// Page scoring on the GPU for each index family: a query head's estimate for every page, from
// the data the CPU index keeps, with the same KVD_HOST_DEVICE arithmetic (index/scoring.hpp,
// simhash.hpp, product_quant.hpp), so the CPU tests cover what the kernel computes:
//   mean_dot       q . row                        (MeanKey, Hierarchical's two levels, Centroid)
//   quest_bound    sum_i max(q_i lo_i, q_i hi_i)  (Quest)
//   simhash        |q| |x| cos(pi hamming / B)    (SimHash)
//   product_quant  sum_m lut[m][code_m]           (ProductQuant; lut built per head by the host)
// One thread per (page, head); est is [group][pages]. The GQA rule and top-k follow on the
// host or in the CUDA backend's top-k kernel.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/core/half.hpp"
#include "kvdrive/index/product_quant.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/simhash.hpp"

namespace kvdrive::cuda {

enum class PageScoreKind { mean_dot, quest_bound, simhash, product_quant };

template <class T>
struct PageScoreParams {
  int group = 1, head_dim = 0;
  std::int64_t pages = 0;
  const float* q = nullptr;                ///< [group][head_dim] (mean_dot, quest_bound)
  const T* rows = nullptr;                 ///< [pages][head_dim]: means (mean_dot) or minima (quest)
  const T* rows_hi = nullptr;              ///< [pages][head_dim]: maxima (quest)
  const std::uint64_t* codes = nullptr;    ///< simhash: [pages][words]
  const std::uint64_t* q_codes = nullptr;  ///< simhash: [group][words]
  int words = 0;
  const T* norms = nullptr;                ///< simhash: [pages]
  const float* q_norms = nullptr;          ///< simhash: [group]
  const float* cos_table = nullptr;        ///< simhash: [bits + 1]
  const std::uint8_t* pq_codes = nullptr;  ///< product_quant: [pages][M]
  const float* lut = nullptr;              ///< product_quant: [group][M][C]
  int M = 0, C = 0;
  float* est = nullptr;  ///< [group][pages]
};

template <class T, PageScoreKind Kind>
__global__ void PageScoreKernel(PageScoreParams<T> p) {
  const std::int64_t page = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (page >= p.pages) return;
  const std::int64_t d = p.head_dim;
  float e = 0.0f;
  if constexpr (Kind == PageScoreKind::mean_dot) {
    e = index::row_dot(p.q + h * d, p.rows + page * d, p.head_dim);
  } else if constexpr (Kind == PageScoreKind::quest_bound) {
    e = index::quest_page_score(p.q + h * d, p.rows + page * d, p.rows_hi + page * d, p.head_dim);
  } else if constexpr (Kind == PageScoreKind::simhash) {
    const int ham = index::simhash_hamming(p.codes + page * p.words, p.q_codes + static_cast<std::int64_t>(h) * p.words, p.words);
    e = index::simhash_estimate(p.q_norms[h], to_float(p.norms[page]), ham, p.cos_table);
  } else {
    e = index::pq_page_score(p.lut + static_cast<std::int64_t>(h) * p.M * p.C, p.pq_codes + page * p.M, p.M, p.C);
  }
  p.est[h * p.pages + page] = e;
}

/// Scores every page for every head of the group; checks the arguments the kind needs.
template <class T>
cudaError_t page_scores(const PageScoreParams<T>& p, PageScoreKind kind, cudaStream_t stream = nullptr) {
  if (p.group < 1 || p.group > 65535 || p.pages < 0 || !p.est) return cudaErrorInvalidValue;
  if (p.pages == 0) return cudaSuccess;
  switch (kind) {
    case PageScoreKind::mean_dot:
      if (!p.q || !p.rows || p.head_dim < 1) return cudaErrorInvalidValue;
      break;
    case PageScoreKind::quest_bound:
      if (!p.q || !p.rows || !p.rows_hi || p.head_dim < 1) return cudaErrorInvalidValue;
      break;
    case PageScoreKind::simhash:
      if (!p.codes || !p.q_codes || p.words < 1 || !p.norms || !p.q_norms || !p.cos_table) return cudaErrorInvalidValue;
      break;
    case PageScoreKind::product_quant:
      if (!p.pq_codes || !p.lut || p.M < 1 || p.C < 1 || p.C > 256) return cudaErrorInvalidValue;
      break;
  }
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((p.pages + kThreads - 1) / kThreads), static_cast<unsigned>(p.group));
  switch (kind) {
    case PageScoreKind::mean_dot: PageScoreKernel<T, PageScoreKind::mean_dot><<<grid, kThreads, 0, stream>>>(p); break;
    case PageScoreKind::quest_bound: PageScoreKernel<T, PageScoreKind::quest_bound><<<grid, kThreads, 0, stream>>>(p); break;
    case PageScoreKind::simhash: PageScoreKernel<T, PageScoreKind::simhash><<<grid, kThreads, 0, stream>>>(p); break;
    case PageScoreKind::product_quant: PageScoreKernel<T, PageScoreKind::product_quant><<<grid, kThreads, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
