// The reference decoder's CPU math (examples/llama3), on Llama-3-8B shapes:
//   BM_Gemv               decode projections: GB/s of fp32 weights read (a 32768 x 4096 matrix,
//                         512 MiB, beyond the caches), next to memcpy bandwidth in the same run
//   BM_GemvOpenBLAS       the same with OpenBLAS's cblas_sgemv, when OpenBLAS is installed
//   BM_Gemm               prefill projections, 256 tokens x 4096 x 4096: GFLOP/s
//   BM_CausalAttention    prefill attention of a 256-token chunk after 8K tokens, 32/8 heads,
//                         head_dim 128: GFLOP/s (scores and values, 4 flops per head-dim-key)
// and the projections computed from GGUF blocks (quant_dot.hpp), on random weights of each type:
//   BM_QuantGemv          decode: GB/s of weight bytes read from a 32768 x 4096 matrix in each
//                         computable type (beyond the caches), next to memcpy
//   BM_SmolLM2Gemv        one decode step's projections of SmolLM2-135M (30 layers of q, k, v, o,
//                         gate, up, down + the 49152-row tied output head) in Q4_1 (with the
//                         file's Q8_0 head), Q8_0 or F32: GB/s and tokens/s-equivalent (weights only)
//   BM_QuantGemm          prefill, 256 tokens x 4096 x 4096: GFLOP/s per type
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef KVD_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "kernels/linear.hpp"
#include "kernels/matrix.hpp"
#include "kernels/prefill_attention.hpp"
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
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(kOut), static_cast<int>(kIn), 1.0f, w.data(), static_cast<int>(kIn), x.data(), 1, 0.0f,
                y.data(), 1);
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
  constexpr std::size_t kStream = static_cast<std::size_t>(kP0 + kTokens) * kDim;  // one KV head's rows
  static const std::vector<float> keys = noise(kStream * kKvHeads, 10), values = noise(kStream * kKvHeads, 20);
  static const std::vector<float> q = noise(static_cast<std::size_t>(kTokens) * kHeads * kDim, 5);
  std::vector<float> out(q.size());
  ThreadPool pool(static_cast<unsigned>(state.range(0)));
  llama::CausalAttentionArgs a;
  a.q = q.data();
  a.out = out.data();
  a.keys = keys.data();
  a.values = values.data();
  a.stream_stride = kStream;
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

/// Random weights of a GGUF type: random bytes for the quantized values and packed scales, fp16
/// block scales of realistic size (|d| ~ 1e-3 .. 5e-2, minimums ~ -8 d), floats in [-1, 1].
std::vector<std::byte> random_weights(llama::GgmlType t, std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  using llama::GgmlType;
  std::vector<std::byte> m(llama::ggml_row_bytes(t, cols) * static_cast<std::size_t>(rows));
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&s] {  // xorshift64*
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dULL;
  };
  for (std::size_t i = 0; i + 8 <= m.size(); i += 8) {
    const std::uint64_t v = next();
    std::memcpy(m.data() + i, &v, 8);
  }
  const llama::GgmlTypeTraits tr = llama::ggml_type_traits(t);
  auto put = [](std::byte* p, float f) {
    const std::uint16_t h = float_to_half_bits(f);
    std::memcpy(p, &h, 2);
  };
  auto scale = [&] { return static_cast<float>(1 + next() % 50) * 1e-3f; };
  for (std::size_t b = 0; b < m.size() / static_cast<std::size_t>(tr.block_bytes); ++b) {
    std::byte* p = m.data() + b * static_cast<std::size_t>(tr.block_bytes);
    switch (t) {
      case GgmlType::F32: {
        const float f = static_cast<float>(static_cast<int>(next() % 2001) - 1000) * 1e-3f;
        std::memcpy(p, &f, 4);
        break;
      }
      case GgmlType::F16: put(p, static_cast<float>(static_cast<int>(next() % 2001) - 1000) * 1e-3f); break;
      case GgmlType::BF16: {
        const std::uint16_t h = float_to_bf16_bits(static_cast<float>(static_cast<int>(next() % 2001) - 1000) * 1e-3f);
        std::memcpy(p, &h, 2);
        break;
      }
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0: put(p, scale()); break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1: {
        const float d = scale();
        put(p, d);
        put(p + 2, -8.0f * d);
        break;
      }
      case GgmlType::Q4_K:
      case GgmlType::Q5_K: put(p, 0.1f * scale()), put(p + 2, 0.1f * scale()); break;
      case GgmlType::Q6_K: put(p + 208, 0.05f * scale()); break;
      default: break;
    }
  }
  return m;
}

constexpr llama::GgmlType kGemvTypes[] = {llama::GgmlType::F32,  llama::GgmlType::F16,  llama::GgmlType::BF16, llama::GgmlType::Q8_0,
                                          llama::GgmlType::Q4_0, llama::GgmlType::Q4_1, llama::GgmlType::Q5_0, llama::GgmlType::Q5_1,
                                          llama::GgmlType::Q4_K, llama::GgmlType::Q5_K, llama::GgmlType::Q6_K};

/// Decode: y = W x with W 32768 x 4096 of the type range(0), range(1) threads.
void BM_QuantGemv(benchmark::State& state) {
  constexpr std::int64_t kOut = 32768, kIn = 4096;
  const auto type = static_cast<llama::GgmlType>(state.range(0));
  const std::vector<std::byte> w = random_weights(type, kOut, kIn, 1);
  const std::vector<float> x = noise(kIn, 2);
  std::vector<float> y(kOut);
  const llama::Matrix m{w.data(), type, kOut, kIn};
  ThreadPool pool(static_cast<unsigned>(state.range(1)));
  double bytes = 0;
  for (auto _ : state) {
    llama::matvec(pool, m, x.data(), y.data());
    benchmark::DoNotOptimize(y.data());
    bytes += static_cast<double>(w.size());
  }
  state.counters["weights_read"] = bench::rate(bytes);
  state.SetLabel(llama::ggml_type_name(type));
}

/// The weight bytes of one SmolLM2-135M decode step with layers of type t (Q4_1: Q8_0 head).
double smollm2_step_bytes(llama::GgmlType t) {
  const auto head = t == llama::GgmlType::Q4_1 ? llama::GgmlType::Q8_0 : t;
  const std::size_t layer = 2 * 576 * llama::ggml_row_bytes(t, 576) + 2 * 192 * llama::ggml_row_bytes(t, 576) +
                            2 * 1536 * llama::ggml_row_bytes(t, 576) + 576 * llama::ggml_row_bytes(t, 1536);
  return static_cast<double>(30 * layer + 49152 * llama::ggml_row_bytes(head, 576));
}

/// One decode step's projections of SmolLM2-135M (hidden 576, 9 heads of 64, 3 KV heads, FFN
/// 1536, 30 layers, vocabulary 49152, tied head) with layers of type range(0) (Q4_1 gets the real
/// file's Q8_0 head), range(1) threads. Every matrix is its own allocation, streamed once a step.
void BM_SmolLM2Gemv(benchmark::State& state) {
  constexpr std::int64_t kDim = 576, kKv = 192, kFfn = 1536, kVocab = 49152;
  constexpr int kLayers = 30;
  const auto type = static_cast<llama::GgmlType>(state.range(0));
  const auto head_type = type == llama::GgmlType::Q4_1 ? llama::GgmlType::Q8_0 : type;
  struct Shape {
    std::int64_t rows, cols;
  };
  const Shape layer[] = {{kDim, kDim}, {kKv, kDim}, {kKv, kDim}, {kDim, kDim}, {kFfn, kDim}, {kFfn, kDim}, {kDim, kFfn}};
  std::vector<std::vector<std::byte>> store;
  std::vector<llama::Matrix> mats;
  std::uint64_t seed = 10;
  for (int l = 0; l < kLayers; ++l)
    for (const Shape& s : layer) store.push_back(random_weights(type, s.rows, s.cols, seed++));
  store.push_back(random_weights(head_type, kVocab, kDim, seed++));
  const double step_bytes = smollm2_step_bytes(type);
  for (std::size_t i = 0; i < store.size(); ++i) {
    const Shape s = i + 1 == store.size() ? Shape{kVocab, kDim} : layer[i % 7];
    mats.push_back({store[i].data(), i + 1 == store.size() ? head_type : type, s.rows, s.cols});
  }
  const std::vector<float> x = noise(kFfn, 3);
  std::vector<float> y(kVocab);
  ThreadPool pool(static_cast<unsigned>(state.range(1)));
  double bytes = 0, steps = 0;
  for (auto _ : state) {
    for (const llama::Matrix& m : mats) llama::matvec(pool, m, x.data(), y.data());
    benchmark::DoNotOptimize(y.data());
    bytes += step_bytes;
    steps += 1;
  }
  state.counters["weights_read"] = bench::rate(bytes);
  state.counters["steps"] = bench::rate(steps, false);
  state.SetLabel(llama::ggml_type_name(type));
}

/// Prefill: Y = X W^T, 256 tokens x 4096 x 4096 of the type range(0), range(1) threads.
void BM_QuantGemm(benchmark::State& state) {
  constexpr std::int64_t kTokens = 256, kOut = 4096, kIn = 4096;
  const auto type = static_cast<llama::GgmlType>(state.range(0));
  const std::vector<std::byte> w = random_weights(type, kOut, kIn, 4);
  const std::vector<float> x = noise(kTokens * kIn, 5);
  std::vector<float> y(kTokens * kOut);
  const llama::Matrix m{w.data(), type, kOut, kIn};
  ThreadPool pool(static_cast<unsigned>(state.range(1)));
  double flops = 0;
  for (auto _ : state) {
    llama::matmul(pool, m, x.data(), y.data(), kTokens);
    benchmark::DoNotOptimize(y.data());
    flops += 2.0 * kTokens * kOut * kIn;
  }
  state.counters["flops"] = bench::rate(flops, false);
  state.SetLabel(llama::ggml_type_name(type));
}

void register_quant_benchmarks() {
  for (llama::GgmlType t : kGemvTypes)
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark("BM_QuantGemv", BM_QuantGemv)
          ->Args({static_cast<std::int64_t>(t), threads})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (llama::GgmlType t : {llama::GgmlType::Q4_1, llama::GgmlType::Q8_0, llama::GgmlType::F32})
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark("BM_SmolLM2Gemv", BM_SmolLM2Gemv)
          ->Args({static_cast<std::int64_t>(t), threads})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (llama::GgmlType t : {llama::GgmlType::Q8_0, llama::GgmlType::Q4_0, llama::GgmlType::Q4_1, llama::GgmlType::Q4_K, llama::GgmlType::Q6_K})
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark("BM_QuantGemm", BM_QuantGemm)
          ->Args({static_cast<std::int64_t>(t), threads})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BM_Memcpy", bench::BM_Memcpy)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
  register_quant_benchmarks();
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
      std::printf("  GEMV threads %s: kvdrive loop %6.2f GiB/s vs OpenBLAS sgemv %6.2f GiB/s  ratio %.2f\n", t, reporter.rate[gemv] / (1u << 30),
                  reporter.rate[blas] / (1u << 30), reporter.rate[gemv] / reporter.rate[blas]);
    for (const char* k : {"BM_Gemm", "BM_CausalAttention"}) {
      const std::string name = std::string(k) + "/" + t + "/real_time";
      if (reporter.has(name)) std::printf("  %-18s threads %s: %6.1f GFLOP/s\n", k, t, reporter.rate[name] / 1e9);
    }
  }
  std::printf("\nProjections from GGUF blocks, same run (GiB/s of weight bytes; memcpy counts bytes copied):\n");
  for (const char* t : {"1", "2"}) {
    const std::string mem = std::string("BM_Memcpy/") + t + "/real_time";
    const double memcpy_rate = reporter.has(mem) ? reporter.rate[mem] : 0.0;
    for (llama::GgmlType type : kGemvTypes) {
      const std::string name = "BM_QuantGemv/" + std::to_string(static_cast<int>(type)) + "/" + t + "/real_time";
      if (!reporter.has(name)) continue;
      std::printf("  GEMV %-5s threads %s: %6.2f GiB/s of weights", llama::ggml_type_name(type).c_str(), t, reporter.rate[name] / (1u << 30));
      if (memcpy_rate > 0) std::printf("  vs memcpy %6.2f GiB/s  ratio %.2f", memcpy_rate / (1u << 30), reporter.rate[name] / memcpy_rate);
      std::printf("\n");
    }
    for (llama::GgmlType type : {llama::GgmlType::Q4_1, llama::GgmlType::Q8_0, llama::GgmlType::F32}) {
      const std::string name = "BM_SmolLM2Gemv/" + std::to_string(static_cast<int>(type)) + "/" + t + "/real_time";
      if (!reporter.has(name)) continue;
      std::printf("  SmolLM2-135M %-5s threads %s: %6.2f GiB/s of weights", llama::ggml_type_name(type).c_str(), t, reporter.rate[name] / (1u << 30));
      if (memcpy_rate > 0) std::printf("  ratio to memcpy %.2f", reporter.rate[name] / memcpy_rate);
      std::printf("  = %6.1f tokens/s (%.1f MB of weights a token)\n", reporter.rate[name] / smollm2_step_bytes(type),
                  smollm2_step_bytes(type) / 1e6);
    }
    for (llama::GgmlType type : {llama::GgmlType::Q8_0, llama::GgmlType::Q4_0, llama::GgmlType::Q4_1, llama::GgmlType::Q4_K, llama::GgmlType::Q6_K}) {
      const std::string name = "BM_QuantGemm/" + std::to_string(static_cast<int>(type)) + "/" + t + "/real_time";
      if (reporter.has(name))
        std::printf("  GEMM %-5s threads %s: %6.1f GFLOP/s\n", llama::ggml_type_name(type).c_str(), t, reporter.rate[name] / 1e9);
    }
  }
  benchmark::Shutdown();
  return 0;
}
