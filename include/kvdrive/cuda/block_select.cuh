// Block-wide selection steps shared by the GPU's selection kernels (top_k.cuh, hierarchical.cuh):
//   block_radix_threshold  a (weighted) radix select over keys made on the fly: the largest key
//                          whose keys above it weigh at least the target (index/radix_select.hpp
//                          has the digit step and its CPU form);
//   write_in_order         the items a predicate keeps, written in index order (a block scan
//                          gives each its place), so selections come out as ascending page ids;
//   block_head_max         each head's largest estimate over n candidates (NaN skipped, as
//                          index::gqa_scores does), the normaliser of the GQA page score.
// Every thread of the block must call them with the same arguments.
#pragma once

#include <cmath>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include "kvdrive/index/radix_select.hpp"

namespace kvdrive::cuda::detail {

template <int Threads>
using OrderScan = cub::BlockScan<int, Threads>;

template <int Threads>
using MaxReduce = cub::BlockReduce<float, Threads>;

/// head_max[h] = the largest of est[h * stride + i] over i in [0, n), for every head h < group
/// (-inf where all are NaN or n is 0). head_max is shared memory of at least `group` floats.
template <int Threads>
__device__ void block_head_max(const float* est, std::int64_t n, std::int64_t stride, int group, float* head_max,
                               typename MaxReduce<Threads>::TempStorage& reduce) {
  const int tid = threadIdx.x;
  for (int h = 0; h < group; ++h) {
    float m = -INFINITY;
    for (std::int64_t i = tid; i < n; i += Threads) {
      const float e = est[h * stride + i];
      m = e > m ? e : m;
    }
    const float all = MaxReduce<Threads>(reduce).Reduce(m, [](float a, float b) { return b > a ? b : a; });
    if (tid == 0) head_max[h] = all;
    __syncthreads();
  }
}

/// Radix select over n keys made by key_of(i), weighted by weight_of(i): the largest key whose
/// keys above weigh at least target (block-wide; every thread gets it).
template <class KeyOf, class WeightOf>
__device__ std::uint64_t block_radix_threshold(std::int64_t n, unsigned long long target, KeyOf key_of, WeightOf weight_of, unsigned long long* hist,
                                               std::uint64_t& s_prefix, unsigned long long& s_left) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    s_prefix = 0;
    s_left = target;
  }
  std::uint64_t mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const std::uint64_t prefix = s_prefix;
    for (std::int64_t i = tid; i < n; i += blockDim.x) {
      const unsigned long long w = weight_of(i);
      if (w == 0) continue;
      const std::uint64_t key = key_of(i);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], w);
    }
    __syncthreads();
    if (tid == 0) {
      unsigned long long left = s_left;
      const int b = index::radix_select_digit(hist, left);
      s_prefix = prefix | (static_cast<std::uint64_t>(b) << shift);
      s_left = left;
    }
    mask |= 0xFFull << shift;
    __syncthreads();
  }
  return s_prefix;
}

/// Writes value(i) for every i in [0, n) with keep(i), in order of i, to out[0..): a block scan
/// per chunk of the block's size places each. `written` is shared scratch.
template <int Threads, class Keep, class Value, class Out>
__device__ void write_in_order(std::int64_t n, Keep keep, Value value, Out* out, typename OrderScan<Threads>::TempStorage& scan, int& written) {
  const int tid = threadIdx.x;
  if (tid == 0) written = 0;
  __syncthreads();
  for (std::int64_t base = 0; base < n; base += Threads) {
    const std::int64_t i = base + tid;
    const int flag = i < n && keep(i) ? 1 : 0;
    int at = 0, total = 0;
    OrderScan<Threads>(scan).ExclusiveSum(flag, at, total);
    if (flag) out[written + at] = value(i);
    __syncthreads();
    if (tid == 0) written += total;
    __syncthreads();
  }
}

}  // namespace kvdrive::cuda::detail
