// The token-rescoring kernels (cuda/token_rescore.cuh) against the CPU's KVD_HOST_DEVICE arithmetic
// (index::token_page_estimate, index::token_first_look) on random keys coded by index::TokenKeys,
// for both page estimates, a pool that skips and repeats pages, and a first look over a range of
// candidates. Exit 77 (skipped) without a GPU.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/token_rescore.cuh"

using namespace kvdrive;

static int check(int group, int d, int tokens, std::int64_t pages, bool max_token, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> keys(static_cast<std::size_t>(pages) * tokens * d), q(static_cast<std::size_t>(group) * d);
  for (auto& x : keys) x = dist(rng);
  for (auto& x : q) x = dist(rng);
  index::TokenKeys k;
  k.append({keys.data(), 0, pages, tokens, d, DType::f32});
  index::IndexQuery iq;
  iq.q = q.data();
  iq.group = group;
  iq.head_dim = d;
  iq.scale = 0.125f;
  index::TokenQuery tq;
  k.fold_query(iq, tq);
  const std::size_t row_bytes = index::token_row_bytes(tokens, d);
  std::vector<std::uint8_t> rows(static_cast<std::size_t>(pages) * row_bytes);
  for (std::int64_t p = 0; p < pages; ++p) std::memcpy(rows.data() + p * row_bytes, k.row(p), row_bytes);
  std::vector<std::uint32_t> pool;
  for (std::int64_t p = 0; p < pages; p += 1 + static_cast<std::int64_t>(rng() % 3)) pool.push_back(static_cast<std::uint32_t>(p));
  pool.push_back(0);  // a page may appear twice: each entry is scored
  const auto n = static_cast<std::int64_t>(pool.size());

  cuda::DeviceBuffer<std::int8_t> dq8{std::span<const std::int8_t>(tq.q8)};
  cuda::DeviceBuffer<float> dscale{std::span<const float>(tq.scale)}, dest(static_cast<std::size_t>(group) * n);
  cuda::DeviceBuffer<int> dsum{std::span<const int>(tq.sum)};
  cuda::DeviceBuffer<std::uint8_t> drows{std::span<const std::uint8_t>(rows)};
  cuda::DeviceBuffer<std::uint32_t> dpool{std::span<const std::uint32_t>(pool)};
  cuda::TokenRescoreParams p;
  p.group = group;
  p.head_dim = d;
  p.page_tokens = tokens;
  p.max_token = max_token;
  p.q8 = dq8.data();
  p.q_scale = dscale.data();
  p.q_sum = dsum.data();
  p.rows = drows.data();
  p.row_bytes = row_bytes;
  p.pool = dpool.data();
  p.n = n;
  p.est = dest.data();
  KVD_CUDA_CHECK(cuda::token_rescore(p));
  KVD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto est = dest.download();
  int bad = 0;
  for (int h = 0; h < group; ++h)
    for (std::int64_t i = 0; i < n; ++i) {
      const float want = index::token_page_estimate(tq.q8.data() + h * d, tq.scale[static_cast<std::size_t>(h)], tq.sum[static_cast<std::size_t>(h)],
                                                    k.row(pool[static_cast<std::size_t>(i)]), tokens, d, max_token);
      const float got = est[static_cast<std::size_t>(h * n + i)];
      if (std::fabs(got - want) > 1e-4f * (1.0f + std::fabs(want))) ++bad;
    }
  // The first look over candidates [1, pages - 1).
  cuda::DeviceBuffer<float> dpair{std::span<const float>(tq.pair_w)}, dfirst(static_cast<std::size_t>(group) * (pages - 2));
  cuda::TokenFirstLookParams f;
  f.group = group;
  f.head_dim = d;
  f.page_tokens = tokens;
  f.q8 = dq8.data();
  f.q_scale = dscale.data();
  f.q_sum = dsum.data();
  f.pair_w = dpair.data();
  f.rows = drows.data();
  f.row_bytes = row_bytes;
  f.first = 1;
  f.n = pages - 2;
  f.est = dfirst.data();
  KVD_CUDA_CHECK(cuda::token_first_look(f));
  KVD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto first = dfirst.download();
  for (int h = 0; h < group; ++h)
    for (std::int64_t i = 0; i < f.n; ++i) {
      const auto hh = static_cast<std::size_t>(h);
      const float want = index::token_first_look(tq.q8.data() + hh * d, tq.scale[hh], tq.sum[hh], tq.pair_w.data() + hh * index::kTokenRadii,
                                                 k.row(1 + i), tokens, d);
      if (std::fabs(first[hh * static_cast<std::size_t>(f.n) + static_cast<std::size_t>(i)] - want) > 1e-4f * (1.0f + std::fabs(want))) ++bad;
    }
  std::printf("token_rescore and token_first_look group %d d %d tokens %d pages %lld max_token %d: %s\n", group, d, tokens,
              static_cast<long long>(pages), max_token ? 1 : 0, bad ? "MISMATCH" : "ok");
  return bad;
}

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the token-rescoring kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(5);
  int bad = 0;
  for (int group : {1, 3, 4})
    for (int d : {64, 128})
      for (bool max_token : {false, true}) bad += check(group, d, 8, 700, max_token, rng);
  bad += check(2, 64, 16, 129, false, rng);
  cuda::TokenRescoreParams badp;
  if (cuda::token_rescore(badp) != cudaErrorInvalidValue) ++bad;
  if (cuda::token_first_look(cuda::TokenFirstLookParams{}) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
