// backend::Cuda: KvManager's backend for a GPU, with cuda::DeviceTier as the fast tier:
//
//   KvManager<Index, Eviction, Tiers<cuda::DeviceTier, SsdTier>, Pipeline, backend::Cuda>
//
// Selection and hit/miss classification run on host threads (parallel_for, the index policies
// are the CPU's), misses are read into pinned host pages and uploaded on the DeviceTier's copy
// stream, and attention runs here on the compute stream: attend() takes the step's page lists
// (device addresses of cache slots) and runs the split-KV kernels of sparse_decode.cuh, whose
// split and merge are the CPU's (Decision 2). With pipeline::Elastic, micro-batches are
// selected and classified on the host while earlier ones are read and uploaded, and each
// computes once its pages are up.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/backend/concept.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/sparse_decode.cuh"
#include "kvdrive/cuda/stream.cuh"

namespace kvdrive::backend {

class Cuda {
 public:
  struct Params {
    int device = 0;
    unsigned threads = 0;  ///< host threads for selection and classification; 0: all
  };

  Cuda() : Cuda(Params{}) {}
  explicit Cuda(Params p) : device_(p.device), pool_(std::make_unique<ThreadPool>(p.threads)) {
    const int n = cuda::device_count();
    KVD_EXPECT(n > 0, "backend::Cuda: no CUDA device is available");
    KVD_EXPECT(device_ >= 0 && device_ < n, "backend::Cuda: device {} out of range [0, {})", device_, n);
    const cuda::DeviceGuard on(device_);
    scratch_ = std::make_unique<Scratch>();
  }

  static constexpr std::string_view name() { return "cuda"; }
  int device() const { return device_; }
  unsigned threads() const { return pool_->threads(); }
  cudaStream_t compute_stream() const { return scratch_->compute.get(); }

  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { pool_->parallel_for(n, fn); }

  /// What the kernels accept, checked when a KvManager is built (not at its first step): head_dim
  /// a multiple of 32 up to 256, a GQA group of at most 32, and a page's K and V in 48 KiB.
  void validate(const Config& c) const { check_shape(c.shape.head_dim, c.group(), c.page_tokens, c.dtype); }

  /// Split-KV sparse decode over the pages of a PagedDecode (device addresses), results copied
  /// back to the host before it returns. Throws kvdrive::Error on bad input or a CUDA failure.
  void attend(const PagedDecode& d) {
    KVD_EXPECT(d.offsets.size() == d.streams + 1 && d.offsets.back() == d.pages.size() && d.tokens.size() == d.pages.size(),
               "backend::Cuda::attend: {} streams need {} offsets ending at the {} pages (got {} offsets, {} token counts)", d.streams, d.streams + 1,
               d.pages.size(), d.offsets.size(), d.tokens.size());
    check_shape(d.head_dim, d.group, d.page_tokens, d.dtype);
    if (d.streams == 0) return;
    std::lock_guard lock(scratch_->mutex);  // one call at a time uses the scratch
    const cuda::DeviceGuard on(device_);
    // A launch takes at most 65535 streams (the grid's y extent); streams are independent, so
    // slices give the same bits.
    for (std::size_t first = 0; first < d.streams; first += kMaxStreams)
      dispatch_dtype(d.dtype, [&](auto tag) { run<typename decltype(tag)::type>(d, first, std::min(d.streams, first + kMaxStreams)); });
  }

 private:
  /// Device buffers kept from call to call, grown as needed.
  struct Scratch {
    std::mutex mutex;
    cuda::Stream compute;
    cuda::DeviceBuffer<float> q, out, lse, page_lse, split_out, split_lse;
    cuda::DeviceBuffer<std::int64_t> offsets;
    cuda::DeviceBuffer<const void*> page_k, page_v;
    cuda::DeviceBuffer<int> tokens;
    std::vector<std::int64_t> h_offsets;
    std::vector<const void*> h_k, h_v;
  };

  static constexpr std::size_t kMaxStreams = 65535;

  static void check_shape(int head_dim, int group, int page_tokens, DType dtype) {
    KVD_EXPECT(head_dim % 32 == 0 && head_dim > 0 && head_dim <= cuda::kSparseDecodeMaxDim,
               "backend::Cuda: head_dim {} must be a multiple of 32 up to {}", head_dim, cuda::kSparseDecodeMaxDim);
    KVD_EXPECT(group >= 1 && group <= cuda::kSparseDecodeMaxGroup, "backend::Cuda: GQA group {} must be 1..{}", group, cuda::kSparseDecodeMaxGroup);
    const std::size_t stage = 2 * static_cast<std::size_t>(page_tokens) * static_cast<std::size_t>(head_dim) * dtype_size(dtype);
    KVD_EXPECT(page_tokens >= 1 && stage <= cuda::kSparseDecodeMaxShared,
               "backend::Cuda: a page of {} tokens x head_dim {} in {} needs {} bytes of shared memory; the kernel stages at most {}", page_tokens,
               head_dim, dtype_name(dtype), stage, cuda::kSparseDecodeMaxShared);
  }

  template <class T>
  static void ensure(cuda::DeviceBuffer<T>& b, std::size_t n) {
    if (b.size() < n) b = cuda::DeviceBuffer<T>(std::max(n, b.size() * 2));
  }

  /// Streams [first, last) of d in one launch: their inputs go up, the kernel runs, and the
  /// outputs come back before it returns.
  template <class T>
  void run(const PagedDecode& d, std::size_t first, std::size_t last) {
    Scratch& s = *scratch_;
    const std::size_t streams = last - first, page0 = d.offsets[first], pages = d.offsets[last] - page0, g = static_cast<std::size_t>(d.group),
                      hd = static_cast<std::size_t>(d.head_dim);
    const std::size_t max_splits = stage_page_lists(d, first, last);
    reserve(streams, pages, max_splits, g, hd);
    const cudaStream_t st = s.compute.get();
    const auto h2d = [&](void* dst, const void* src, std::size_t bytes) {
      if (bytes) KVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
    };
    h2d(s.q.data(), d.q + first * g * hd, streams * g * hd * sizeof(float));
    h2d(s.offsets.data(), s.h_offsets.data(), (streams + 1) * sizeof(std::int64_t));
    h2d(s.page_k.data(), s.h_k.data(), pages * sizeof(const void*));
    h2d(s.page_v.data(), s.h_v.data(), pages * sizeof(const void*));
    h2d(s.tokens.data(), d.tokens.data() + page0, pages * sizeof(int));
    KVD_CUDA_CHECK(cuda::sparse_decode(kernel_params<T>(d, streams, max_splits), st));
    KVD_CUDA_CHECK(cudaMemcpyAsync(d.out + first * g * hd, s.out.data(), streams * g * hd * sizeof(float), cudaMemcpyDeviceToHost, st));
    KVD_CUDA_CHECK(cudaMemcpyAsync(d.lse + first * g, s.lse.data(), streams * g * sizeof(float), cudaMemcpyDeviceToHost, st));
    if (pages) KVD_CUDA_CHECK(cudaMemcpyAsync(d.page_lse + page0 * g, s.page_lse.data(), pages * g * sizeof(float), cudaMemcpyDeviceToHost, st));
    KVD_CUDA_CHECK(cudaStreamSynchronize(st));
  }

  /// The page lists of streams [first, last) in host scratch (offsets from the first page, K and
  /// V addresses, checked token counts); returns the most splits a stream has.
  std::size_t stage_page_lists(const PagedDecode& d, std::size_t first, std::size_t last) {
    Scratch& s = *scratch_;
    const std::size_t streams = last - first, page0 = d.offsets[first], pages = d.offsets[last] - page0;
    std::size_t max_splits = 1;
    s.h_offsets.resize(streams + 1);
    for (std::size_t i = 0; i <= streams; ++i) s.h_offsets[i] = static_cast<std::int64_t>(d.offsets[first + i] - page0);
    for (std::size_t i = 0; i < streams; ++i)
      max_splits = std::max(max_splits, attention::split_count(static_cast<std::size_t>(s.h_offsets[i + 1] - s.h_offsets[i])));
    s.h_k.resize(pages);
    s.h_v.resize(pages);
    for (std::size_t i = 0; i < pages; ++i) {
      const std::int32_t tokens = d.tokens[page0 + i];
      KVD_EXPECT(tokens >= 0 && tokens <= d.page_tokens, "backend::Cuda: page {} has {} tokens; pages hold {}", page0 + i, tokens, d.page_tokens);
      s.h_k[i] = d.pages[page0 + i];
      s.h_v[i] = d.pages[page0 + i] + d.block_bytes;
    }
    return max_splits;
  }

  /// Device scratch for a launch of this size.
  void reserve(std::size_t streams, std::size_t pages, std::size_t max_splits, std::size_t g, std::size_t hd) {
    Scratch& s = *scratch_;
    ensure(s.q, streams * g * hd);
    ensure(s.out, streams * g * hd);
    ensure(s.lse, streams * g);
    ensure(s.page_lse, std::max<std::size_t>(1, pages * g));
    ensure(s.split_out, streams * max_splits * g * hd);
    ensure(s.split_lse, streams * max_splits * g);
    ensure(s.offsets, streams + 1);
    ensure(s.page_k, std::max<std::size_t>(1, pages));
    ensure(s.page_v, std::max<std::size_t>(1, pages));
    ensure(s.tokens, std::max<std::size_t>(1, pages));
  }

  /// The kernel's arguments over the device scratch.
  template <class T>
  cuda::SparseDecodeParams<T> kernel_params(const PagedDecode& d, std::size_t streams, std::size_t max_splits) {
    Scratch& s = *scratch_;
    cuda::SparseDecodeParams<T> p;
    p.q = s.q.data();
    p.page_k = reinterpret_cast<const T* const*>(s.page_k.data());
    p.page_v = reinterpret_cast<const T* const*>(s.page_v.data());
    p.page_tokens = s.tokens.data();
    p.page_offsets = s.offsets.data();
    p.out = s.out.data();
    p.lse = s.lse.data();
    p.page_lse = s.page_lse.data();
    p.split_out = s.split_out.data();
    p.split_lse = s.split_lse.data();
    p.max_splits = static_cast<int>(max_splits);
    p.max_page_tokens = d.page_tokens;
    p.streams = static_cast<int>(streams);
    p.group = d.group;
    p.head_dim = d.head_dim;
    p.scale = d.scale;
    return p;
  }

  int device_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scratch> scratch_;  // after the device is set
};
static_assert(DeviceBackend<Cuda>);

}  // namespace kvdrive::backend
