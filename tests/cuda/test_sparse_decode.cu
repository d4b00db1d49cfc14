// The sparse decode kernels against the CPU's split-KV attention on the same pages
// (attention::sparse_decode per split of 8 pages, merged by attention::merge_splits, as KvManager
// computes it; f32, f16, bf16; GQA 1, 4, 8; head_dim 64 and 128; partial last pages), with pages
// scattered over a device pool in random order. The same page list placed in other slots gives
// bitwise the same output (Decision 2 on the GPU). Exit 77 (skipped) without a GPU.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <span>
#include <random>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/sparse_decode.cuh"

using namespace kvdrive;

template <class T>
static int check(int streams, int group, int d, int page_tokens, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  // Each stream attends 1..40 pages; the last one partial.
  std::vector<std::int64_t> offsets{0};
  std::vector<int> rows;
  for (int s = 0; s < streams; ++s) {
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) rows.push_back(i + 1 < n ? page_tokens : 1 + static_cast<int>(rng() % page_tokens));
    offsets.push_back(offsets.back() + n);
  }
  const std::size_t pages = rows.size(), page_elems = static_cast<std::size_t>(page_tokens) * d;
  std::vector<float> q(static_cast<std::size_t>(streams) * group * d);
  for (auto& x : q) x = dist(rng) * 0.5f;
  std::vector<T> k(pages * page_elems), v(k.size());
  for (auto& x : k) x = from_float<T>(dist(rng));
  for (auto& x : v) x = from_float<T>(dist(rng));

  // Four runs over the same pages in a device pool of 2 x pages slots: two placements, staging
  // the split's pages together (stage_pages 0); one page at a time (1); and pages one element off
  // 16-byte alignment (element-wise staging). All four must give the same bits.
  const std::size_t pool_slots = 2 * pages;
  cuda::DeviceBuffer<T> pool_k(pool_slots * page_elems + 1), pool_v(pool_slots * page_elems + 1);
  cuda::DeviceBuffer<float> dq{std::span<const float>(q)};
  cuda::DeviceBuffer<int> drows{std::span<const int>(rows)};
  cuda::DeviceBuffer<std::int64_t> doff{std::span<const std::int64_t>(offsets)};
  std::vector<std::vector<float>> outs, lses, page_lses;
  int bad = 0;
  for (int placement = 0; placement < 4; ++placement) {
    const std::size_t shift = placement == 3 ? 1 : 0;
    std::vector<std::size_t> slot(pool_slots);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    std::vector<const T*> pk(pages), pv(pages);
    for (std::size_t i = 0; i < pages; ++i) {
      pk[i] = pool_k.data() + shift + slot[i] * page_elems;
      pv[i] = pool_v.data() + shift + slot[i] * page_elems;
      KVD_CUDA_CHECK(cudaMemcpy(const_cast<T*>(pk[i]), k.data() + i * page_elems, page_elems * sizeof(T), cudaMemcpyHostToDevice));
      KVD_CUDA_CHECK(cudaMemcpy(const_cast<T*>(pv[i]), v.data() + i * page_elems, page_elems * sizeof(T), cudaMemcpyHostToDevice));
    }
    cuda::DeviceBuffer<const T*> dpk{std::span<const T*const>(pk)}, dpv{std::span<const T*const>(pv)};
    cuda::DeviceBuffer<float> dout(q.size()), dlse(static_cast<std::size_t>(streams) * group), dplse(pages * group);
    const int max_splits = static_cast<int>(attention::split_count(40));
    cuda::DeviceBuffer<float> dsplit_out(static_cast<std::size_t>(streams) * max_splits * group * d),
        dsplit_lse(static_cast<std::size_t>(streams) * max_splits * group);
    cuda::SparseDecodeParams<T> p;
    p.q = dq.data();
    p.page_k = dpk.data();
    p.page_v = dpv.data();
    p.page_tokens = drows.data();
    p.page_offsets = doff.data();
    p.out = dout.data();
    p.lse = dlse.data();
    p.page_lse = dplse.data();
    p.split_out = dsplit_out.data();
    p.split_lse = dsplit_lse.data();
    p.max_splits = max_splits;
    p.max_page_tokens = page_tokens;
    p.stage_pages = placement == 2 ? 1 : 0;
    p.streams = streams;
    p.group = group;
    p.head_dim = d;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    KVD_CUDA_CHECK(cuda::sparse_decode(p));
    KVD_CUDA_CHECK(cudaDeviceSynchronize());
    outs.push_back(dout.download());
    const auto lse = dlse.download(), plse = dplse.download();
    lses.push_back(lse), page_lses.push_back(plse);
    if (placement != 0) continue;
    for (int s = 0; s < streams; ++s) {
      std::vector<attention::PageRef> refs;
      for (std::int64_t i = offsets[static_cast<std::size_t>(s)]; i < offsets[static_cast<std::size_t>(s) + 1]; ++i)
        refs.push_back({k.data() + static_cast<std::size_t>(i) * page_elems, v.data() + static_cast<std::size_t>(i) * page_elems,
                        rows[static_cast<std::size_t>(i)]});
      std::vector<float> cout(static_cast<std::size_t>(group) * d), clse(group), cplse(refs.size() * group);
      const std::size_t splits = attention::split_count(refs.size());
      std::vector<float> souts(splits * group * d), slses(splits * group);
      for (std::size_t sp = 0; sp < splits; ++sp) {
        const std::size_t a0 = sp * attention::kSplitPages, n = std::min(attention::kSplitPages, refs.size() - a0);
        attention::DecodeArgs a;
        a.q = q.data() + static_cast<std::size_t>(s) * group * d;
        a.group = group;
        a.head_dim = d;
        a.scale = p.scale;
        a.pages = std::span<const attention::PageRef>(refs).subspan(a0, n);
        a.out = souts.data() + sp * group * d;
        a.lse = slses.data() + sp * group;
        a.page_lse = cplse.data() + a0 * group;
        attention::sparse_decode<T>(a);
      }
      attention::merge_splits(group, d, splits, souts.data(), slses.data(), cout.data(), clse.data());
      for (int i = 0; i < group * d; ++i)
        if (std::fabs(cout[i] - outs[0][static_cast<std::size_t>(s) * group * d + i]) > 1e-4f) ++bad;
      for (int h = 0; h < group; ++h) {
        if (std::fabs(clse[h] - lse[static_cast<std::size_t>(s) * group + h]) > 1e-4f) ++bad;
        for (std::size_t i = 0; i < refs.size(); ++i)
          if (std::fabs(cplse[i * group + h] - plse[(static_cast<std::size_t>(offsets[static_cast<std::size_t>(s)]) + i) * group + h]) > 1e-4f) ++bad;
      }
    }
  }
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (std::size_t r = 1; r < outs.size(); ++r)  // independent of placement, staging and alignment
    if (!same(outs[0], outs[r]) || !same(lses[0], lses[r]) || !same(page_lses[0], page_lses[r])) ++bad;
  std::printf("sparse_decode %s group %d d %d page %d: %s\n", dtype_name(dtype_of<T>).data(), group, d, page_tokens, bad ? "MISMATCH" : "ok");
  return bad;
}

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the sparse decode kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(3);
  int bad = 0;
  for (int group : {1, 4, 8})
    for (int d : {32, 64, 96, 128, 256})
      for (int page_tokens : {8, 16}) {
        bad += check<float>(5, group, d, page_tokens, rng);
        bad += check<half>(5, group, d, page_tokens, rng);
        bad += check<bfloat16>(5, group, d, page_tokens, rng);
      }
  cuda::SparseDecodeParams<float> badp;
  if (cuda::sparse_decode(badp) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
