// The parts of a decode-attention block that the dense and sparse kernels share. A warp holds a
// query head's row spread over its lanes (per_lane elements each, head_dim = 32 x per_lane):
//   fold_page              one page's tokens into a page partial (m, l, acc), token by token;
//   merge_warps_and_store  the warps' partials merged in warp order, then the output and the
//                          log-sum-exp written by warp 0.
// The merge order is fixed, so results are deterministic run to run (Decision 2).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/half.hpp"

namespace kvdrive::cuda::detail {

/// Folds `tokens` rows of k and v ([tokens][d]) into the page partial (mp, lp, accp): each
/// token is a one-token partial (m = score, l = 1, acc = v).
template <class T, int PerLaneMax>
__device__ void fold_page(const float (&qr)[PerLaneMax], const T* k, const T* v, int tokens, int d, int per_lane, int lane, float scale, float& mp,
                          float& lp, float (&accp)[PerLaneMax]) {
  for (int t = 0; t < tokens; ++t) {
    float s = 0.0f;
    for (int i = 0; i < per_lane; ++i) s += qr[i] * to_float(k[static_cast<std::int64_t>(t) * d + lane + 32 * i]);
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    s *= scale;
    float vr[PerLaneMax];
    for (int i = 0; i < per_lane; ++i) vr[i] = to_float(v[static_cast<std::int64_t>(t) * d + lane + 32 * i]);
    attention::merge_partial(mp, lp, accp, s, 1.0f, vr, per_lane);
  }
}

/// Merges the Warps warps' partials in warp order; warp 0 writes out[d] (normalised) and, if
/// lse is given, the log-sum-exp. Every thread of the block must call it.
template <int Warps, int MaxDim, int PerLaneMax>
__device__ void merge_warps_and_store(float m, float l, const float (&acc)[PerLaneMax], int per_lane, float* out, float* lse) {
  __shared__ float sm[Warps], sl[Warps];
  __shared__ float sacc[Warps][MaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int i = 0; i < per_lane; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float fm = sm[0], fl = sl[0], facc[PerLaneMax];
  for (int i = 0; i < per_lane; ++i) facc[i] = sacc[0][lane + 32 * i];
  for (int w = 1; w < Warps; ++w) {
    float wacc[PerLaneMax];
    for (int i = 0; i < per_lane; ++i) wacc[i] = sacc[w][lane + 32 * i];
    attention::merge_partial(fm, fl, facc, sm[w], sl[w], wacc, per_lane);
  }
  const float inv = fl > 0.0f ? 1.0f / fl : 0.0f;
  for (int i = 0; i < per_lane; ++i) out[lane + 32 * i] = facc[i] * inv;
  if (lse && lane == 0) *lse = attention::partial_lse(fm, fl);
}

}  // namespace kvdrive::cuda::detail
