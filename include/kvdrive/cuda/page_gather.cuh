// Page gather: copies a step's missed pages from wherever they live (pinned host memory mapped
// into the device's address space, or device memory) into their cache slots in device memory.
// Two ways, which the GPU benchmark measures against each other and against one contiguous
// cudaMemcpyAsync of the same bytes:
//   gather_pages          one kernel: a block per page reads the source through the mapping
//                         (zero-copy over PCIe) in 16-byte words and writes the slot;
//   gather_pages_memcpy   one cudaMemcpyAsync per page on the stream (the copy engine).
// The kernel takes its page lists as device-visible arrays of pointers; the copy-engine way
// takes host arrays.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive::cuda {

struct PageGatherParams {
  const std::byte* const* src = nullptr;  ///< [pages] device-accessible sources (device or mapped pinned host)
  std::byte* const* dst = nullptr;        ///< [pages] device destinations (cache slots)
  std::size_t page_bytes = 0;
  int pages = 0;
};

/// How many 16-byte words a page-sized copy moves as words: bytes / 16 when both ends are
/// 16-byte aligned, else 0. The rest (a tail, or everything) is copied byte by byte.
KVD_HOST_DEVICE std::size_t gather_words(const void* src, const void* dst, std::size_t bytes) {
  const bool aligned = (reinterpret_cast<std::uintptr_t>(src) % 16 == 0) && (reinterpret_cast<std::uintptr_t>(dst) % 16 == 0);
  return aligned ? bytes / 16 : 0;
}

inline constexpr int kGatherThreads = 256;

__global__ void PageGatherKernel(PageGatherParams p) {
  const std::byte* src = p.src[blockIdx.x];
  std::byte* dst = p.dst[blockIdx.x];
  const std::size_t words = gather_words(src, dst, p.page_bytes);
  const auto* s4 = reinterpret_cast<const uint4*>(src);
  auto* d4 = reinterpret_cast<uint4*>(dst);
  for (std::size_t i = threadIdx.x; i < words; i += blockDim.x) d4[i] = s4[i];
  for (std::size_t i = words * 16 + threadIdx.x; i < p.page_bytes; i += blockDim.x) dst[i] = src[i];
}

/// Launches PageGatherKernel; src and dst must be device-visible arrays of `pages` pointers.
inline cudaError_t gather_pages(const PageGatherParams& p, cudaStream_t stream = nullptr) {
  if (p.pages < 0 || (p.pages > 0 && (!p.src || !p.dst || p.page_bytes == 0))) return cudaErrorInvalidValue;
  if (p.pages == 0) return cudaSuccess;
  PageGatherKernel<<<static_cast<unsigned>(p.pages), kGatherThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

/// The copy-engine alternative: one cudaMemcpyAsync per page, src and dst host arrays.
inline cudaError_t gather_pages_memcpy(const std::byte* const* src, std::byte* const* dst, int pages, std::size_t page_bytes,
                                       cudaStream_t stream = nullptr) {
  if (pages < 0 || (pages > 0 && (!src || !dst || page_bytes == 0))) return cudaErrorInvalidValue;
  for (int i = 0; i < pages; ++i) {
    const cudaError_t e = cudaMemcpyAsync(dst[i], src[i], page_bytes, cudaMemcpyDefault, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace kvdrive::cuda
