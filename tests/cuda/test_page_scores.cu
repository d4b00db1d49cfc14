// The page-scoring kernel against the CPU's KVD_HOST_DEVICE scoring functions, for every index
// family and the three KV dtypes, on random index data. Exit 77 (skipped) without a GPU.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvdrive/core/dtype.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/page_scores.cuh"

using namespace kvdrive;

template <class T>
static int check(int group, int d, std::int64_t pages, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> q(static_cast<std::size_t>(group) * d);
  for (auto& x : q) x = dist(rng);
  std::vector<T> lo(static_cast<std::size_t>(pages) * d), hi(lo.size()), norms(static_cast<std::size_t>(pages));
  for (std::size_t i = 0; i < lo.size(); ++i) {
    const float a = dist(rng), b = dist(rng);
    lo[i] = from_float<T>(std::fmin(a, b));
    hi[i] = from_float<T>(std::fmax(a, b));
  }
  for (auto& x : norms) x = from_float<T>(std::fabs(dist(rng)));
  const int words = 3, bits = 150, M = 8, C = 16;
  std::vector<std::uint64_t> codes(static_cast<std::size_t>(pages) * words), q_codes(static_cast<std::size_t>(group) * words);
  for (auto& w : codes) w = (static_cast<std::uint64_t>(rng()) << 32 | rng());
  for (auto& w : q_codes) w = (static_cast<std::uint64_t>(rng()) << 32 | rng());
  for (std::int64_t p = 0; p < pages; ++p) codes[static_cast<std::size_t>(p) * words + 2] &= (1ull << (bits - 128)) - 1;
  for (int h = 0; h < group; ++h) q_codes[static_cast<std::size_t>(h) * words + 2] &= (1ull << (bits - 128)) - 1;
  std::vector<float> q_norms(static_cast<std::size_t>(group)), cos_table(bits + 1), lut(static_cast<std::size_t>(group) * M * C);
  for (auto& x : q_norms) x = std::fabs(dist(rng));
  for (int h = 0; h <= bits; ++h) cos_table[static_cast<std::size_t>(h)] = std::cos(3.14159265f * h / bits);
  for (auto& x : lut) x = dist(rng);
  std::vector<std::uint8_t> pq(static_cast<std::size_t>(pages) * M);
  for (auto& c : pq) c = static_cast<std::uint8_t>(rng() % C);

  cuda::DeviceBuffer<float> dq{std::span<const float>(q)}, dqn{std::span<const float>(q_norms)}, dcos{std::span<const float>(cos_table)},
      dlut{std::span<const float>(lut)}, dest(static_cast<std::size_t>(group) * pages);
  cuda::DeviceBuffer<T> dlo{std::span<const T>(lo)}, dhi{std::span<const T>(hi)}, dn{std::span<const T>(norms)};
  cuda::DeviceBuffer<std::uint64_t> dc{std::span<const std::uint64_t>(codes)}, dqc{std::span<const std::uint64_t>(q_codes)};
  cuda::DeviceBuffer<std::uint8_t> dpq{std::span<const std::uint8_t>(pq)};
  cuda::PageScoreParams<T> p;
  p.group = group;
  p.head_dim = d;
  p.pages = pages;
  p.q = dq.data();
  p.rows = dlo.data();
  p.rows_hi = dhi.data();
  p.codes = dc.data();
  p.q_codes = dqc.data();
  p.words = words;
  p.norms = dn.data();
  p.q_norms = dqn.data();
  p.cos_table = dcos.data();
  p.pq_codes = dpq.data();
  p.lut = dlut.data();
  p.M = M;
  p.C = C;
  p.est = dest.data();
  int bad = 0;
  for (auto kind :
       {cuda::PageScoreKind::mean_dot, cuda::PageScoreKind::quest_bound, cuda::PageScoreKind::simhash, cuda::PageScoreKind::product_quant}) {
    KVD_CUDA_CHECK(cuda::page_scores(p, kind));
    KVD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto est = dest.download();
    for (int h = 0; h < group; ++h)
      for (std::int64_t pg = 0; pg < pages; ++pg) {
        float want = 0;
        const std::size_t at = static_cast<std::size_t>(pg) * d;
        switch (kind) {
          case cuda::PageScoreKind::mean_dot: want = index::row_dot(q.data() + h * d, lo.data() + at, d); break;
          case cuda::PageScoreKind::quest_bound: want = index::quest_page_score(q.data() + h * d, lo.data() + at, hi.data() + at, d); break;
          case cuda::PageScoreKind::simhash:
            want = index::simhash_estimate(q_norms[static_cast<std::size_t>(h)], to_float(norms[static_cast<std::size_t>(pg)]),
                                           index::simhash_hamming(codes.data() + pg * words, q_codes.data() + h * words, words), cos_table.data());
            break;
          case cuda::PageScoreKind::product_quant:
            want = index::pq_page_score(lut.data() + static_cast<std::size_t>(h) * M * C, pq.data() + pg * M, M, C);
            break;
        }
        const float got = est[static_cast<std::size_t>(h) * pages + static_cast<std::size_t>(pg)];
        if (std::fabs(got - want) > 1e-4f * (1.0f + std::fabs(want))) ++bad;
      }
  }
  std::printf("page_scores %s group %d d %d pages %lld: %s\n", dtype_name(dtype_of<T>).data(), group, d, static_cast<long long>(pages),
              bad ? "MISMATCH" : "ok");
  return bad;
}

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the page-scoring kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(2);
  int bad = 0;
  for (int group : {1, 4})
    for (int d : {64, 128}) {
      bad += check<float>(group, d, 1000, rng);
      bad += check<half>(group, d, 333, rng);
      bad += check<bfloat16>(group, d, 129, rng);
    }
  cuda::PageScoreParams<float> badp;
  if (cuda::page_scores(badp, cuda::PageScoreKind::mean_dot) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
