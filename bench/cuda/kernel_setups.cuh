// bench_gpu's kernel inputs on the device: the page lists of sparse decode attention (every
// stream its own pages, at random slots of a pool that holds exactly them) and the pinned, mapped
// host pages and scattered device slots of the page gather, each with the launches it times.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/half.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/page_gather.cuh"
#include "kvdrive/cuda/sparse_decode.cuh"

namespace kvdrive::bench_gpu {

namespace kc = kvdrive::cuda;

/// The page lists of `streams` streams attending `pages_per_stream` pages each, every stream its
/// own distinct pages, at random slots of a pool that holds exactly them.
struct SparseSetup {
  int streams, group, d, page_tokens;
  kc::DeviceBuffer<half> k, v;
  kc::DeviceBuffer<float> q, out, lse, split_out, split_lse;
  int max_splits = 0;
  kc::DeviceBuffer<const half*> pk, pv;
  kc::DeviceBuffer<int> rows;
  kc::DeviceBuffer<std::int64_t> offsets;
  std::size_t attended_bytes = 0;

  SparseSetup(int streams_, int group_, int d_, int page_tokens_, std::int64_t pages_per_stream, std::mt19937& rng)
      : streams(streams_), group(group_), d(d_), page_tokens(page_tokens_) {
    const std::int64_t pool_pages = static_cast<std::int64_t>(streams) * pages_per_stream;
    const std::size_t page_elems = static_cast<std::size_t>(page_tokens) * d;
    k = kc::DeviceBuffer<half>(static_cast<std::size_t>(pool_pages) * page_elems);
    v = kc::DeviceBuffer<half>(k.size());
    KVD_CUDA_CHECK(cudaMemset(k.data(), 0x22, k.bytes()));
    KVD_CUDA_CHECK(cudaMemset(v.data(), 0x11, v.bytes()));
    std::vector<float> hq(static_cast<std::size_t>(streams) * group * d);
    std::normal_distribution<float> dist;
    for (auto& x : hq) x = dist(rng) * 0.1f;
    q = kc::DeviceBuffer<float>(std::span<const float>(hq));
    out = kc::DeviceBuffer<float>(hq.size());
    lse = kc::DeviceBuffer<float>(static_cast<std::size_t>(streams) * group);
    max_splits = static_cast<int>(kvdrive::attention::split_count(static_cast<std::size_t>(pages_per_stream)));
    split_out = kc::DeviceBuffer<float>(static_cast<std::size_t>(streams) * max_splits * group * d);
    split_lse = kc::DeviceBuffer<float>(static_cast<std::size_t>(streams) * max_splits * group);
    std::vector<const half*> hk, hv;
    std::vector<int> hr;
    std::vector<std::int64_t> ho{0};
    std::vector<std::int64_t> pool(static_cast<std::size_t>(pool_pages));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);  // a cache holds pages in any order
    for (int s = 0; s < streams; ++s) {
      for (std::int64_t j = 0; j < pages_per_stream; ++j) {
        const std::int64_t sl = pool[static_cast<std::size_t>(s * pages_per_stream + j)];
        hk.push_back(k.data() + static_cast<std::size_t>(sl) * page_elems);
        hv.push_back(v.data() + static_cast<std::size_t>(sl) * page_elems);
        hr.push_back(page_tokens);
      }
      ho.push_back(ho.back() + pages_per_stream);
    }
    pk = kc::DeviceBuffer<const half*>(std::span<const half* const>(hk));
    pv = kc::DeviceBuffer<const half*>(std::span<const half* const>(hv));
    rows = kc::DeviceBuffer<int>(std::span<const int>(hr));
    offsets = kc::DeviceBuffer<std::int64_t>(std::span<const std::int64_t>(ho));
    attended_bytes = static_cast<std::size_t>(streams) * static_cast<std::size_t>(pages_per_stream) * page_elems * sizeof(half) * 2;
  }

  int stage_pages = 0;  ///< SparseDecodeParams::stage_pages: 0, as many as fit; 1, page by page

  void launch(cudaStream_t s) {
    kc::SparseDecodeParams<half> p;
    p.q = q.data();
    p.page_k = pk.data();
    p.page_v = pv.data();
    p.page_tokens = rows.data();
    p.page_offsets = offsets.data();
    p.out = out.data();
    p.lse = lse.data();
    p.split_out = split_out.data();
    p.split_lse = split_lse.data();
    p.max_splits = max_splits;
    p.max_page_tokens = page_tokens;
    p.stage_pages = stage_pages;
    p.streams = streams;
    p.group = group;
    p.head_dim = d;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    KVD_CUDA_CHECK(kc::sparse_decode(p, s));
  }
};

/// Pinned, mapped host pages and scattered device slots for gathering `pages` pages.
struct GatherSetup {
  std::size_t page_bytes;
  int pages;
  std::byte* host = nullptr;
  kc::DeviceBuffer<std::byte> slots;
  std::vector<const std::byte*> src_host;
  std::vector<std::byte*> dst;
  kc::DeviceBuffer<const std::byte*> d_src;
  kc::DeviceBuffer<std::byte*> d_dst;

  GatherSetup(std::size_t page_bytes_, int pages_, std::mt19937& rng) : page_bytes(page_bytes_), pages(pages_) {
    const std::size_t pool = static_cast<std::size_t>(pages) * 4;
    KVD_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), pool * page_bytes, cudaHostAllocMapped));
    std::memset(host, 0x5a, pool * page_bytes);
    std::byte* host_dev = nullptr;
    KVD_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0));
    slots = kc::DeviceBuffer<std::byte>(pool * page_bytes);
    std::vector<const std::byte*> src_dev;
    std::vector<std::size_t> from(pool), to(pool);
    std::iota(from.begin(), from.end(), 0);
    std::iota(to.begin(), to.end(), 0);
    std::shuffle(from.begin(), from.end(), rng);
    std::shuffle(to.begin(), to.end(), rng);
    for (int i = 0; i < pages; ++i) {
      src_host.push_back(host + from[static_cast<std::size_t>(i)] * page_bytes);
      src_dev.push_back(host_dev + from[static_cast<std::size_t>(i)] * page_bytes);
      dst.push_back(slots.data() + to[static_cast<std::size_t>(i)] * page_bytes);
    }
    d_src = kc::DeviceBuffer<const std::byte*>(std::span<const std::byte* const>(src_dev));
    d_dst = kc::DeviceBuffer<std::byte*>(std::span<std::byte* const>(dst));
  }
  ~GatherSetup() {
    if (host) cudaFreeHost(host);
  }
  void kernel(cudaStream_t s) { KVD_CUDA_CHECK(kc::gather_pages({d_src.data(), d_dst.data(), page_bytes, pages}, s)); }
  void memcpys(cudaStream_t s) { KVD_CUDA_CHECK(kc::gather_pages_memcpy(src_host.data(), dst.data(), pages, page_bytes, s)); }
  void contiguous(cudaStream_t s) {
    KVD_CUDA_CHECK(cudaMemcpyAsync(slots.data(), host, static_cast<std::size_t>(pages) * page_bytes, cudaMemcpyHostToDevice, s));
  }
};

}  // namespace kvdrive::bench_gpu
