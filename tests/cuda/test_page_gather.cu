// The page-gather kernel and the per-page cudaMemcpyAsync path: pages scattered in pinned,
// mapped host memory land byte for byte in scattered device slots, aligned and not. Exit 77
// (skipped) without a GPU.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/page_gather.cuh"

using namespace kvdrive;

static int check(std::size_t page_bytes, std::size_t offset, std::mt19937& rng) {
  const int pages = 37, pool = 64;
  std::byte* host = nullptr;
  KVD_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), pool * page_bytes + offset, cudaHostAllocMapped));
  for (std::size_t i = 0; i < pool * page_bytes + offset; ++i) host[i] = static_cast<std::byte>(rng());
  std::byte* host_dev = nullptr;
  KVD_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0));
  cuda::DeviceBuffer<std::byte> slots(pool * page_bytes + offset);
  std::vector<const std::byte*> src_dev(pages), src_host(pages);
  std::vector<std::byte*> dst(pages);
  std::vector<int> from(pages), to(pages);
  for (int i = 0; i < pages; ++i) {
    from[static_cast<std::size_t>(i)] = static_cast<int>(rng() % pool);
    to[static_cast<std::size_t>(i)] = (i * 7 + 3) % pool;  // distinct slots
    src_dev[static_cast<std::size_t>(i)] = host_dev + offset + from[static_cast<std::size_t>(i)] * page_bytes;
    src_host[static_cast<std::size_t>(i)] = host + offset + from[static_cast<std::size_t>(i)] * page_bytes;
    dst[static_cast<std::size_t>(i)] = slots.data() + offset + to[static_cast<std::size_t>(i)] * page_bytes;
  }
  int bad = 0;
  for (int way = 0; way < 2; ++way) {
    KVD_CUDA_CHECK(cudaMemset(slots.data(), 0, slots.bytes()));
    if (way == 0) {
      cuda::DeviceBuffer<const std::byte*> d_src{std::span<const std::byte* const>(src_dev)};
      cuda::DeviceBuffer<std::byte*> d_dst{std::span<std::byte* const>(dst)};
      KVD_CUDA_CHECK(cuda::gather_pages({d_src.data(), d_dst.data(), page_bytes, pages}));
    } else {
      KVD_CUDA_CHECK(cuda::gather_pages_memcpy(src_host.data(), dst.data(), pages, page_bytes));
    }
    KVD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = slots.download();
    for (int i = 0; i < pages; ++i)
      if (std::memcmp(got.data() + offset + to[static_cast<std::size_t>(i)] * page_bytes,
                      host + offset + from[static_cast<std::size_t>(i)] * page_bytes, page_bytes) != 0)
        ++bad;
    std::printf("gather %s: %zu-byte pages at offset %zu: %s\n", way == 0 ? "kernel" : "memcpy", page_bytes, offset, bad ? "MISMATCH" : "ok");
  }
  KVD_CUDA_CHECK(cudaFreeHost(host));
  return bad;
}

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the page-gather kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(9);
  int bad = check(4096, 0, rng) + check(2048 + 48, 0, rng) + check(4101, 0, rng) + check(4096, 3, rng);
  if (cuda::gather_pages({nullptr, nullptr, 4096, 2}) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
