// The reference decoder's CPU math (examples/llama3), on Llama-3-8B shapes:
//   BM_Gemv               decode projections: GB/s of fp32 weights read (a 32768 x 4096 matrix,
//                         512 MiB, beyond the caches), next to memcpy bandwidth in the same run
//   BM_GemvOpenBLAS       the same with OpenBLAS's cblas_sgemv, when OpenBLAS is installed
//   BM_Gemm               prefill projections, 256 tokens x 4096 x 4096: GFLOP/s
//   BM_CausalAttention    prefill attention of a 256-token chunk after 8K tokens, 32/8 heads,
//                         head_dim 128: GFLOP/s (scores and values, 4 flops per head-dim-key)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#ifdef KVD_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "linear.hpp"
#include "prefill_attention.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

std::vector<float> noise(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : v) x = u(rng);
  return v;
}

void BM_Gemv(benchmark::State& state) {
  constexpr std::size_t kOut = 32768, kIn = 4096;
  static const std::vector<float> w = noise(kOut * kIn, 1), x = noise(kIn, 2);
  std::vector<float> y(kOut);
  ThreadPool pool(static_cast<unsigned>(state.range(0)));
  double bytes = 0;
  for (auto _ : state) {
    llama::matvec(pool, w.data(), x.data(), y.data(), kOut, kIn);
    benchmark::DoNotOptimize(y.data());
    bytes += static_cast<double>(w.size() * sizeof(float));
  }
  state.counters["weights_read"] = bench::rate(bytes);
}
BENCHMARK(BM_Gemv)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

#ifdef KVD_HAVE_OPENBLAS
/// The same product with OpenBLAS's cblas_sgemv, for comparison.
void BM_GemvOpenBLAS(benchmark::State& state) {
  constexpr std::size_t kOut = 32768, kIn = 4096;
  static const std::vector<float> w = noise(kOut * kIn, 1), x = noise(kIn, 2);
  std::vector<float> y(kOut);
  openblas_set_num_threads(static_cast<int>(state.range(0)));
  double bytes = 0;
  for (auto _ : state) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(kOut), static_cast<int>(kIn), 1.0f, w.data(),
                static_cast<int>(kIn), x.data(), 1, 0.0f, y.data(), 1);
    benchmark::DoNotOptimize(y.data());
    bytes += static_cast<double>(w.size() * sizeof(float));
  }
  state.counters["weights_read"] = bench::rate(bytes);
}
BENCHMARK(BM_GemvOpenBLAS)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

void BM_Gemm(benchmark::State& state) {
  constexpr std::size_t kTokens = 256, kOut = 4096, kIn = 4096;
  static const std::vector<float> w = noise(kOut * kIn, 3), x = noise(kTokens * kIn, 4);
  std::vector<float> y(kTokens * kOut);
  ThreadPool pool(static_cast<unsigned>(state.range(0)));
  double flops = 0;
  for (auto _ : state) {
    llama::matmul(pool, w.data(), x.data(), y.data(), kTokens, kOut, kIn);
    benchmark::DoNotOptimize(y.data());
    flops += 2.0 * kTokens * kOut * kIn;
  }
  state.counters["flops"] = bench::rate(flops, false);
}
BENCHMARK(BM_Gemm)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CausalAttention(benchmark::State& state) {
  constexpr int kHeads = 32, kKvHeads = 8, kDim = 128;
  constexpr std::int64_t kP0 = 8192, kTokens = 256;
  static const std::vector<std::vector<float>> keys = [] {
    std::vector<std::vector<float>> k;
    for (int h = 0; h < kKvHeads; ++h) k.push_back(noise(static_cast<std::size_t>(kP0 + kTokens) * kDim, 10 + h));
    return k;
  }();
  static const std::vector<std::vector<float>> values = [] {
    std::vector<std::vector<float>> v;
    for (int h = 0; h < kKvHeads; ++h) v.push_back(noise(static_cast<std::size_t>(kP0 + kTokens) * kDim, 20 + h));
    return v;
  }();
  static const std::vector<float> q = noise(static_cast<std::size_t>(kTokens) * kHeads * kDim, 5);
  std::vector<float> out(q.size());
  ThreadPool pool(static_cast<unsigned>(state.range(0)));
  llama::CausalAttentionArgs a;
  a.q = q.data();
  a.out = out.data();
  a.keys = &keys;
  a.values = &values;
  a.p0 = kP0;
  a.tokens = kTokens;
  a.heads = kHeads;
  a.kv_heads = kKvHeads;
  a.head_dim = kDim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  double flops = 0;
  for (auto _ : state) {
    llama::causal_attention(pool, a);
    benchmark::DoNotOptimize(out.data());
    flops += llama::causal_attention_flops(kP0, kTokens, kHeads, kDim);
  }
  state.counters["flops"] = bench::rate(flops, false);
}
BENCHMARK(BM_CausalAttention)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BM_Memcpy", bench::BM_Memcpy)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::Initialize(&argc, argv);
  bench::Collect reporter({"weights_read", "copied", "flops"});
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\nDecoder math on the CPU, same run:\n");
  for (const char* t : {"1", "2"}) {
    const std::string gemv = std::string("BM_Gemv/") + t + "/real_time", mem = std::string("BM_Memcpy/") + t + "/real_time";
    if (reporter.has(gemv) && reporter.has(mem))
      std::printf("  GEMV threads %s: %6.2f GiB/s of weights vs memcpy %6.2f GiB/s (bytes copied/s)  ratio %.2f\n", t,
                  reporter.rate[gemv] / (1u << 30), reporter.rate[mem] / (1u << 30), reporter.rate[gemv] / reporter.rate[mem]);
    const std::string blas = std::string("BM_GemvOpenBLAS/") + t + "/real_time";
    if (reporter.has(gemv) && reporter.has(blas))
      std::printf("  GEMV threads %s: kvdrive loop %6.2f GiB/s vs OpenBLAS sgemv %6.2f GiB/s  ratio %.2f\n", t,
                  reporter.rate[gemv] / (1u << 30), reporter.rate[blas] / (1u << 30), reporter.rate[gemv] / reporter.rate[blas]);
    for (const char* k : {"BM_Gemm", "BM_CausalAttention"}) {
      const std::string name = std::string(k) + "/" + t + "/real_time";
      if (reporter.has(name)) std::printf("  %-18s threads %s: %6.1f GFLOP/s\n", k, t, reporter.rate[name] / 1e9);
    }
  }
  benchmark::Shutdown();
  return 0;
}
