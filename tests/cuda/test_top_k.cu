// The top-k kernel against the CPU's selection (index::gqa_scores + index::top_pages): random
// per-head estimates with many ties and some NaN, for streams small enough for the block sort
// and large enough for the radix select. Exit 77 (skipped) without a GPU.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/top_k.cuh"

using namespace kvdrive;

int main() {
  if (kvdrive::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the top-k kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(5);
  const int group = 4, max_k = 1200;
  const std::vector<int> candidates = {1, 7, 300, 2048, 2049, 5000, 20000, 0};
  const std::vector<int> ks = {1, 3, 19, 128, 128, 313, 1200, 4};
  const auto streams = static_cast<int>(candidates.size());
  const std::int64_t stride = 20000;
  std::vector<float> est(static_cast<std::size_t>(streams) * group * stride, 0.0f);
  for (float& x : est) x = rng() % 50 == 0 ? NAN : static_cast<float>(static_cast<int>(rng() % 64)) / 8.0f;  // ties
  std::vector<std::int64_t> first(static_cast<std::size_t>(streams));
  for (int s = 0; s < streams; ++s) first[static_cast<std::size_t>(s)] = 4 + 1000 * s;

  kvdrive::cuda::DeviceBuffer<float> d_est{std::span<const float>(est)};
  kvdrive::cuda::DeviceBuffer<int> d_cand{std::span<const int>(candidates)}, d_k{std::span<const int>(ks)},
      d_count(static_cast<std::size_t>(streams));
  kvdrive::cuda::DeviceBuffer<std::int64_t> d_first{std::span<const std::int64_t>(first)};
  kvdrive::cuda::DeviceBuffer<std::uint32_t> d_out(static_cast<std::size_t>(streams) * max_k);
  kvdrive::cuda::TopKParams p;
  p.est = d_est.data();
  p.stride = stride;
  p.candidates = d_cand.data();
  p.k = d_k.data();
  p.first_page = d_first.data();
  p.out = d_out.data();
  p.out_count = d_count.data();
  p.streams = streams;
  p.group = group;
  p.max_k = max_k;
  KVD_CUDA_CHECK(kvdrive::cuda::top_k(p));
  KVD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = d_out.download();
  const auto count = d_count.download();
  int bad = 0;
  for (int s = 0; s < streams; ++s) {
    const auto n = static_cast<std::size_t>(candidates[static_cast<std::size_t>(s)]);
    std::vector<float> head_est(static_cast<std::size_t>(group) * n), score(n);
    for (int h = 0; h < group; ++h)
      for (std::size_t i = 0; i < n; ++i) head_est[static_cast<std::size_t>(h) * n + i] = est[(static_cast<std::size_t>(s) * group + h) * stride + i];
    index::gqa_scores(head_est.data(), group, n, score.data());
    std::vector<std::uint32_t> want;
    index::top_pages(score, first[static_cast<std::size_t>(s)], ks[static_cast<std::size_t>(s)], want);
    const std::vector<std::uint32_t> got(out.begin() + static_cast<std::ptrdiff_t>(s) * max_k,
                                         out.begin() + static_cast<std::ptrdiff_t>(s) * max_k + count[static_cast<std::size_t>(s)]);
    const bool ok = got == want;
    bad += !ok;
    std::printf("top_k stream %d: %zu candidates, k %d, %s path: %s\n", s, n, ks[static_cast<std::size_t>(s)],
                n <= static_cast<std::size_t>(kvdrive::cuda::kTopKSortCapacity) ? "block sort" : "radix select", ok ? "ok" : "MISMATCH");
  }
  kvdrive::cuda::TopKParams badp = p;
  badp.group = 0;
  if (kvdrive::cuda::top_k(badp) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
