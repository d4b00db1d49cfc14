// The GPU's two-level Hierarchical selection against the CPU's Hierarchical::select on the same
// index (f16 and f32, GQA 1 and 4, several budgets and candidate ranges, members with and without pair radii). nvcc contracts the
// dot products' multiply-adds into FMAs, so pages at a near-tie may differ: at most 2% of a
// selection (and two pages) may. Exit 77 (skipped) without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvdrive/core/dtype.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/hierarchical.cuh"

namespace kc = kvdrive::cuda;
namespace ki = kvdrive::index;
using kvdrive::DType;

template <class T>
static int check(DType dtype, int group, std::mt19937& rng, const ki::HierarchicalParams& params = {}) {
  const int d = 64, pt = 8;
  const std::vector<int> pages_of = {600, 1500, 40};
  const auto streams = static_cast<int>(pages_of.size());
  std::normal_distribution<float> dist;
  const ki::Hierarchical index(params);
  std::vector<ki::Hierarchical::State> states(static_cast<std::size_t>(streams));
  std::vector<std::vector<float>> qs;
  std::vector<kc::HierarchicalOnDevice<T>> on_device;
  std::vector<kc::HierarchicalDeviceIndex<T>> views;
  std::vector<std::int64_t> first, end, budget;
  std::int64_t stride = 1, words = 1;
  for (int s = 0; s < streams; ++s) {
    const int pages = pages_of[static_cast<std::size_t>(s)];
    // Keys drifting along topics, so that clusters mean something.
    std::vector<float> keys(static_cast<std::size_t>(pages) * pt * d), topic(d);
    for (int p = 0; p < pages; ++p) {
      if (p % 50 == 0)
        for (auto& x : topic) x = dist(rng);
      for (int t = 0; t < pt; ++t)
        for (int j = 0; j < d; ++j) keys[(static_cast<std::size_t>(p) * pt + t) * d + j] = topic[j] + 0.5f * dist(rng);
    }
    index.build(states[static_cast<std::size_t>(s)], ki::PageKeys{keys.data(), 0, pages, pt, d, dtype});
    const ki::HierarchicalFlat flat = ki::flatten(states[static_cast<std::size_t>(s)]);
    on_device.emplace_back(flat);
    views.push_back(on_device.back().view());
    stride = std::max(stride, flat.clusters() + flat.members());
    words = std::max<std::int64_t>(words, pages / 32 + 1);
    std::vector<float> q(static_cast<std::size_t>(group) * d);
    for (auto& x : q) x = dist(rng);
    qs.push_back(q);
    first.push_back(1);
    end.push_back(pages - 3);
    budget.push_back(s == 2 ? 100 : std::max<std::int64_t>(1, (pages - 4) / 16));  // the last: more than the candidates
  }
  std::vector<float> q_all;
  for (const auto& q : qs) q_all.insert(q_all.end(), q.begin(), q.end());
  const int max_k = 200;
  kc::DeviceBuffer<kc::HierarchicalDeviceIndex<T>> d_views{std::span<const kc::HierarchicalDeviceIndex<T>>(views)};
  kc::DeviceBuffer<float> d_q{std::span<const float>(q_all)}, d_est(static_cast<std::size_t>(streams) * group * stride);
  kc::DeviceBuffer<std::int64_t> d_first{std::span<const std::int64_t>(first)}, d_end{std::span<const std::int64_t>(end)},
      d_budget{std::span<const std::int64_t>(budget)};
  kc::DeviceBuffer<unsigned> d_count(static_cast<std::size_t>(streams) * stride);
  kc::DeviceBuffer<std::uint32_t> d_bitmap(static_cast<std::size_t>(streams) * words), d_out(static_cast<std::size_t>(streams) * max_k);
  kc::DeviceBuffer<int> d_n(static_cast<std::size_t>(streams));
  kc::HierarchicalSelectParams<T> p;
  p.index = d_views.data();
  p.q = d_q.data();
  p.first_candidate = d_first.data();
  p.end_candidate = d_end.data();
  p.budget = d_budget.data();
  p.radius_weight = index.params.radius_weight;
  p.expand = index.params.expand;
  p.min_scored = index.params.min_scored;
  p.score_all_below = index.params.score_all_below;
  p.pair_weight = index.params.pair_weight;
  p.rotary = index.params.rotary;
  p.scratch_est = d_est.data();
  p.scratch_count = d_count.data();
  p.scratch_bitmap = d_bitmap.data();
  p.scratch_stride = stride;
  p.bitmap_words = words;
  p.out = d_out.data();
  p.out_count = d_n.data();
  p.streams = streams;
  p.group = group;
  p.head_dim = d;
  p.max_k = max_k;
  KVD_CUDA_CHECK(kc::hierarchical_select(p));
  KVD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = d_out.download();
  const auto n = d_n.download();
  int bad = 0;
  for (int s = 0; s < streams; ++s) {
    ki::IndexQuery iq;
    iq.q = qs[static_cast<std::size_t>(s)].data();
    iq.group = group;
    iq.head_dim = d;
    iq.first_candidate = first[static_cast<std::size_t>(s)];
    iq.end_candidate = end[static_cast<std::size_t>(s)];
    iq.budget_pages = std::min(budget[static_cast<std::size_t>(s)], iq.candidates());
    std::vector<std::uint32_t> want;
    index.select(states[static_cast<std::size_t>(s)], iq, want);
    const std::vector<std::uint32_t> got(out.begin() + static_cast<std::ptrdiff_t>(s) * max_k,
                                         out.begin() + static_cast<std::ptrdiff_t>(s) * max_k + n[static_cast<std::size_t>(s)]);
    std::vector<std::uint32_t> diff;
    std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
    const bool ordered = std::is_sorted(got.begin(), got.end()) && std::adjacent_find(got.begin(), got.end()) == got.end();
    const bool ok = got.size() == want.size() && ordered && diff.size() <= std::max<std::size_t>(2, want.size() / 50);
    bad += !ok;
    std::printf("hierarchical %s group %d pair radii %d stream %d: %zu pages, %zu differ from the CPU's: %s\n", kvdrive::dtype_name(dtype).data(),
                group, params.pair_radii, s, got.size(), diff.size() / 2, ok ? "ok" : "MISMATCH");
  }
  return bad;
}

int main() {
  if (kc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the hierarchical selection kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(4);
  int bad = 0;
  for (int group : {1, 4}) {
    bad += check<float>(DType::f32, group, rng);
    bad += check<kvdrive::half>(DType::f16, group, rng);
    // Members scored with two rotary-pair radii (index::HierarchicalParams::pair_radii).
    bad += check<kvdrive::half>(DType::f16, group, rng, ki::HierarchicalParams{.pair_radii = 2});
    // Every stream pruned by its clusters (none scored whole), and every stream scored whole.
    bad += check<float>(DType::f32, group, rng, ki::HierarchicalParams{.score_all_below = 0});
    bad += check<float>(DType::f32, group, rng, ki::HierarchicalParams{.score_all_below = 2000});
  }
  kc::HierarchicalSelectParams<float> badp;
  badp.streams = 1;
  if (kc::hierarchical_select(badp) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
