// Decoding coded pages (codec/page_codec.hpp) on the GPU: a block per page reads the page's
// group codes into shared memory, then its threads decode K and V into the page's slot in the KV
// dtype. The arithmetic is codec/quantize.hpp's, as on the CPU (codec/cpu_codec.hpp), so a
// decoded page is the same bits on both.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kvdrive/codec/page_codec.hpp"
#include "kvdrive/codec/quantize.hpp"
#include "kvdrive/core/half.hpp"

namespace kvdrive::cuda {

template <class T>
struct PageDecodeParams {
  const std::uint8_t* const* coded = nullptr;  ///< [pages] device-accessible coded pages
  T* const* pages = nullptr;                   ///< [pages] device destinations: K block then V block
  codec::CodedLayout layout{};
  int pages_count = 0;
};

inline constexpr int kDecodeThreads = 256;

template <class T>
__global__ void PageDecodeKernel(PageDecodeParams<T> p) {
  extern __shared__ float decode_shared[];  // GroupRange [head_dim] key channels, then [tokens] value tokens
  auto* ranges = reinterpret_cast<codec::GroupRange*>(decode_shared);
  const codec::CodedLayout& l = p.layout;
  const std::uint8_t* coded = p.coded[blockIdx.x];
  T* page = p.pages[blockIdx.x];
  codec::BlockRange keys{}, values{};
  {
    float f[4];
    for (int i = 0; i < 4; ++i) {  // the header may sit at any byte offset
      std::uint32_t u = 0;
      for (int b = 0; b < 4; ++b) u |= static_cast<std::uint32_t>(coded[4 * i + b]) << (8 * b);
      f[i] = __uint_as_float(u);
    }
    keys = {f[0], f[1]}, values = {f[2], f[3]};
  }
  for (std::uint32_t c = threadIdx.x; c < l.head_dim; c += blockDim.x)
    ranges[c] = codec::group_range(keys, coded[l.key_codes + 2 * c], coded[l.key_codes + 2 * c + 1], l.inv_levels);
  for (std::uint32_t t = threadIdx.x; t < l.tokens; t += blockDim.x)
    ranges[l.head_dim + t] = codec::group_range(values, coded[l.value_codes + 2 * t], coded[l.value_codes + 2 * t + 1], l.inv_levels);
  __syncthreads();
  const std::size_t n = std::size_t{l.tokens} * l.head_dim;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const auto t = static_cast<std::uint32_t>(i / l.head_dim), c = static_cast<std::uint32_t>(i % l.head_dim);
    page[i] = from_float<T>(codec::dequantize(ranges[c], codec::load_code(coded + l.key_data, i, l.bits)));
    page[n + i] = from_float<T>(codec::dequantize(ranges[l.head_dim + t], codec::load_code(coded + l.value_data, i, l.bits)));
  }
}

/// Shared memory PageDecodeKernel needs for a layout.
inline std::size_t page_decode_shared_bytes(const codec::CodedLayout& l) { return (std::size_t{l.head_dim} + l.tokens) * sizeof(codec::GroupRange); }

/// Launches PageDecodeKernel; `coded` and `pages` must be device-visible arrays of pages_count pointers.
template <class T>
cudaError_t decode_pages(const PageDecodeParams<T>& p, cudaStream_t stream = nullptr) {
  if (p.pages_count < 0 || (p.pages_count > 0 && (!p.coded || !p.pages || p.layout.bytes == 0))) return cudaErrorInvalidValue;
  if (p.pages_count == 0) return cudaSuccess;
  const std::size_t shared = page_decode_shared_bytes(p.layout);
  if (shared > 48 * 1024) return cudaErrorInvalidValue;  // 4,096 tokens + 1,024 channels: 61 KiB; pages that large are not coded
  PageDecodeKernel<T><<<static_cast<unsigned>(p.pages_count), kDecodeThreads, shared, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvdrive::cuda
