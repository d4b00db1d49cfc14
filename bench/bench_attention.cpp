// CPU sparse decode attention: GB/s of KV read, next to the machine's memcpy bandwidth measured
// in the same run, and their ratio.
//
// Shape: Llama-3-8B attention (4 query heads per KV head, head_dim 128, fp16 KV, 8-token pages
// = 4 KiB), batch 4 x 8 KV heads = 32 streams of 32K tokens (512 MiB of KV). Sparse: each stream
// attends sink + 6.25% of its pages + local, a fresh random selection per iteration from 16
// prepared ones, so the pages come from DRAM rather than cache. Pages live in the host tier's
// PagePool (4 KiB slots in huge-page-backed blocks). memcpy copies 256 MiB; its
// figure is bytes copied per second (each byte read once and written once).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

constexpr int kGroup = 4, kDim = 128, kPageTokens = 8, kStreams = 32, kPagesPerStream = 4096;
constexpr double kBudget = 0.0625;
constexpr int kSelections = 16;
constexpr std::size_t kPageBytes = 2ull * kPageTokens * kDim * sizeof(half);

struct Fixture {
  tier::PagePool pool;                                                   // the host tier's page pool: 4 KiB slots in huge-page-backed blocks
  std::vector<tier::PagePool::Slot> slots;                               // [streams][pages]
  std::vector<float> q;                                                  // [streams][group][dim]
  std::vector<std::vector<std::vector<attention::PageRef>>> selections;  // [selection][stream]
  std::vector<std::vector<attention::PageRef>> dense;                    // [stream]

  Fixture() {
    pool.open(kPageBytes, 4096, 0);
    std::uint64_t x = 88172645463325252ull;
    for (int i = 0; i < kStreams * kPagesPerStream; ++i) {
      slots.push_back(pool.allocate());
      half* h = reinterpret_cast<half*>(pool.data(slots.back()));
      for (std::size_t e = 0; e < kPageBytes / sizeof(half); ++e) {  // xorshift: fast for 512 MiB
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        h[e] = half(static_cast<float>(static_cast<std::int64_t>(x % 2001) - 1000) * 1e-3f);
      }
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    q.resize(static_cast<std::size_t>(kStreams) * kGroup * kDim);
    for (auto& v : q) v = nd(rng);
    const int selected = static_cast<int>(kBudget * kPagesPerStream);
    const int local_pages = 64 / kPageTokens;
    for (int s = 0; s < kSelections; ++s) {
      std::vector<std::vector<attention::PageRef>> per_stream(kStreams);
      for (int st = 0; st < kStreams; ++st) {
        std::vector<int> pages(kPagesPerStream - 1 - local_pages);
        std::iota(pages.begin(), pages.end(), 1);
        std::shuffle(pages.begin(), pages.end(), rng);
        pages.resize(selected);
        pages.push_back(0);  // sink
        for (int l = kPagesPerStream - local_pages; l < kPagesPerStream; ++l) pages.push_back(l);
        std::sort(pages.begin(), pages.end());
        for (int p : pages) per_stream[st].push_back(ref(st, p));
      }
      selections.push_back(std::move(per_stream));
    }
    dense.resize(kStreams);
    for (int st = 0; st < kStreams; ++st)
      for (int p = 0; p < kPagesPerStream; ++p) dense[st].push_back(ref(st, p));
  }

  attention::PageRef ref(int stream, int page) const {
    const auto* base = reinterpret_cast<const half*>(pool.data(slots[static_cast<std::size_t>(stream) * kPagesPerStream + page]));
    return {base, base + kPageTokens * kDim, kPageTokens};
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void run_streams(ThreadPool& pool, const std::vector<std::vector<attention::PageRef>>& refs, std::vector<float>& out) {
  Fixture& f = fixture();
  pool.parallel_for(kStreams, [&](std::size_t st) {
    attention::DecodeArgs a;
    a.q = f.q.data() + st * kGroup * kDim;
    a.group = kGroup;
    a.head_dim = kDim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    a.pages = refs[st];
    a.out = out.data() + st * kGroup * kDim;
    attention::sparse_decode<half>(a);
  });
}

void BM_SparseAttention(benchmark::State& state) {
  Fixture& f = fixture();
  ThreadPool pool(static_cast<unsigned>(state.range(0)));
  std::vector<float> out(static_cast<std::size_t>(kStreams) * kGroup * kDim);
  std::size_t bytes = 0, i = 0;
  for (auto _ : state) {
    const auto& sel = f.selections[i++ % kSelections];
    run_streams(pool, sel, out);
    benchmark::DoNotOptimize(out.data());
    for (const auto& s : sel) bytes += s.size() * kPageBytes;
  }
  state.counters["KV_read"] = bench::rate(static_cast<double>(bytes));
}
BENCHMARK(BM_SparseAttention)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DenseAttention(benchmark::State& state) {
  Fixture& f = fixture();
  ThreadPool pool(static_cast<unsigned>(state.range(0)));
  std::vector<float> out(static_cast<std::size_t>(kStreams) * kGroup * kDim);
  std::size_t bytes = 0;
  for (auto _ : state) {
    run_streams(pool, f.dense, out);
    benchmark::DoNotOptimize(out.data());
    bytes += static_cast<std::size_t>(kStreams) * kPagesPerStream * kPageBytes;
  }
  state.counters["KV_read"] = bench::rate(static_cast<double>(bytes));
}
BENCHMARK(BM_DenseAttention)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BM_Memcpy", bench::BM_Memcpy)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::Initialize(&argc, argv);
  fixture();  // build the 512 MiB pool before timing anything
  bench::Collect reporter({"KV_read", "copied"});
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto gib = [](double b) { return b / (1u << 30); };
  std::printf("\nCPU attention KV read rate vs memcpy (bytes copied/s), same threads, same run:\n");
  for (const char* threads : {"1", "2"}) {
    const std::string mem = std::string("BM_Memcpy/") + threads + "/real_time";
    if (!reporter.has(mem)) continue;
    for (const char* kind : {"BM_SparseAttention", "BM_DenseAttention"}) {
      const std::string name = std::string(kind) + "/" + threads + "/real_time";
      if (!reporter.has(name)) continue;
      std::printf("  %-20s threads %s: %6.2f GiB/s vs memcpy %6.2f GiB/s  ratio %.2f\n", kind, threads, gib(reporter.rate[name]),
                  gib(reporter.rate[mem]), reporter.rate[name] / reporter.rate[mem]);
    }
  }
  benchmark::Shutdown();
  return 0;
}
