// The dense decode kernel against the CPU attention on the same data (f32, f16, bf16; GQA 1, 4,
// 8; head_dim 64 and 128; page sizes that do not divide the context). Exit 77 (skipped) without
// a GPU.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/dense_decode.cuh"
#include "kvdrive/cuda/device_buffer.cuh"

using namespace kvdrive;

template <class T>
static int check(int streams, int group, int d, int page_tokens, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  const int max_tokens = 300;
  std::vector<int> tokens(streams);
  for (auto& t : tokens) t = 1 + static_cast<int>(rng() % max_tokens);
  std::vector<float> q(static_cast<std::size_t>(streams) * group * d);
  for (auto& x : q) x = dist(rng) * 0.5f;
  std::vector<T> k(static_cast<std::size_t>(streams) * max_tokens * d), v(k.size());
  for (auto& x : k) x = from_float<T>(dist(rng));
  for (auto& x : v) x = from_float<T>(dist(rng));
  const int max_pages = (max_tokens + page_tokens - 1) / page_tokens;

  cuda::DeviceBuffer<float> dq{std::span<const float>(q)};
  cuda::DeviceBuffer<T> dk{std::span<const T>(k)}, dv{std::span<const T>(v)};
  cuda::DeviceBuffer<int> dt{std::span<const int>(tokens)};
  cuda::DeviceBuffer<float> dout(q.size()), dlse(static_cast<std::size_t>(streams) * group),
      dplse(static_cast<std::size_t>(streams) * max_pages * group);
  cuda::DenseDecodeParams<T> p;
  p.q = dq.data();
  p.k = dk.data();
  p.v = dv.data();
  p.tokens = dt.data();
  p.kv_stride = static_cast<std::int64_t>(max_tokens) * d;
  p.out = dout.data();
  p.lse = dlse.data();
  p.page_lse = dplse.data();
  p.streams = streams;
  p.group = group;
  p.head_dim = d;
  p.page_tokens = page_tokens;
  p.max_pages = max_pages;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  KVD_CUDA_CHECK(cuda::dense_decode(p));
  KVD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = dout.download(), lse = dlse.download(), plse = dplse.download();

  int bad = 0;
  for (int s = 0; s < streams; ++s) {
    // The CPU reference: the same pages, by pointer.
    std::vector<std::vector<T>> pages;
    std::vector<attention::PageRef> refs;
    const int n_pages = (tokens[s] + page_tokens - 1) / page_tokens;
    for (int pg = 0; pg < n_pages; ++pg) {
      const int first = pg * page_tokens, n = std::min(page_tokens, tokens[s] - first);
      const T* kp = k.data() + (static_cast<std::size_t>(s) * max_tokens + first) * d;
      const T* vp = v.data() + (static_cast<std::size_t>(s) * max_tokens + first) * d;
      refs.push_back({kp, vp, n});
    }
    std::vector<float> cout(static_cast<std::size_t>(group) * d), clse(group), cplse(static_cast<std::size_t>(n_pages) * group);
    attention::DecodeArgs a;
    a.q = q.data() + static_cast<std::size_t>(s) * group * d;
    a.group = group;
    a.head_dim = d;
    a.scale = p.scale;
    a.pages = refs;
    a.out = cout.data();
    a.lse = clse.data();
    a.page_lse = cplse.data();
    attention::sparse_decode<T>(a);
    for (int i = 0; i < group * d; ++i)
      if (std::fabs(cout[i] - out[static_cast<std::size_t>(s) * group * d + i]) > 1e-4f) ++bad;
    for (int h = 0; h < group; ++h) {
      if (std::fabs(clse[h] - lse[static_cast<std::size_t>(s) * group + h]) > 1e-4f) ++bad;
      for (int pg = 0; pg < n_pages; ++pg)
        if (std::fabs(cplse[static_cast<std::size_t>(pg) * group + h] - plse[(static_cast<std::size_t>(s) * max_pages + pg) * group + h]) > 1e-4f)
          ++bad;
    }
  }
  std::printf("dense_decode %s group %d d %d page %d: %s\n", dtype_name(dtype_of<T>).data(), group, d, page_tokens, bad ? "MISMATCH" : "ok");
  return bad;
}

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the dense decode kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(1);
  int bad = 0;
  for (int group : {1, 4, 8})
    for (int d : {64, 128})
      for (int page_tokens : {1, 7, 16}) {
        bad += check<float>(3, group, d, page_tokens, rng);
        bad += check<half>(3, group, d, page_tokens, rng);
        bad += check<bfloat16>(3, group, d, page_tokens, rng);
      }
  // The launcher rejects bad arguments instead of launching.
  cuda::DenseDecodeParams<float> badp;
  if (cuda::dense_decode(badp) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
