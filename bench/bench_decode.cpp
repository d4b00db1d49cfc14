// One decode step of the reference decoder, dense vs sparse, at contexts of 4K, 16K, 64K and
// 128K tokens on a synthetic Llama-3-8B-shaped stack (2 layers of dim 4096, 32/8 heads, head_dim
// 128, FFN 14336, vocab 32000, fp16 KV). Sparse: index::Quest at a 6.25% budget plus 4 sink and
// 64 local tokens. A CPU cannot prefill 128K tokens of this model in a benchmark's time, so the
// context's K/V are written straight into the manager (KvManager::prefill with seeded values)
// instead of computed: a decode step's time does not depend on the values. The step includes
// everything: projections, FFN, logits and attention through KvManager.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decoder/decoder.hpp"
#include "decoder/sampler.hpp"
#include "kvdrive/kvdrive.hpp"
#include "support.hpp"
#include "model/synthetic.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

const Model& model() {
  static const Model m = make_synthetic({"llama3-8b-layer", 1},
                                        ShapeOverrides{.layers = 2, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool());
  return m;
}

Config kv_config(bool sparse) {
  const auto& c = model().config;
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.dtype = DType::f16;
  cfg.budget = sparse ? Budget::fraction(0.0625) : Budget::fraction(1.0);
  return cfg;
}

/// A manager and decoder holding `context` tokens; one at a time, to bound memory.
struct DecodeRun {
  virtual ~DecodeRun() = default;
  virtual void step() = 0;
  virtual Stats stats() const = 0;
};

template <class Index>
struct RunWith : DecodeRun {
  KvManager<Index, eviction::Lru> kv;
  Decoder<KvManager<Index, eviction::Lru>> dec;
  int token = 1;
  RunWith(bool sparse, std::int64_t context) : kv(kv_config(sparse)), dec(model(), kv, pool()) {
    const auto& c = model().config;
    const std::int64_t chunk = 4096;
    std::vector<float> k, v;
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    auto next = [&] {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return static_cast<float>(static_cast<std::int64_t>(x % 2001) - 1000) * 1e-3f;
    };
    for (int l = 0; l < c.layers; ++l)
      for (std::int64_t t0 = 0; t0 < context; t0 += chunk) {
        const std::int64_t n = std::min(chunk, context - t0);
        k.resize(static_cast<std::size_t>(n * c.kv_dim()));
        v.resize(k.size());
        for (auto& e : k) e = next();
        for (auto& e : v) e = next();
        kv.prefill(dec.sequence(), l, make_view(k, n, c.kv_heads, c.head_dim()), make_view(v, n, c.kv_heads, c.head_dim()));
      }
    dec.adopt_context(context);
  }
  void step() override { token = Sampler::argmax(dec.step(token)); }
  Stats stats() const override { return kv.total_stats(); }
};

std::unique_ptr<DecodeRun>& current() {
  static std::unique_ptr<DecodeRun> r;
  return r;
}

void BM_DecodeStep(benchmark::State& state) {
  const std::int64_t context = state.range(0);
  const bool sparse = state.range(1) != 0;
  current().reset();  // free the previous context first
  if (sparse) current() = std::make_unique<RunWith<index::Quest>>(true, context);
  else current() = std::make_unique<RunWith<index::Dense>>(false, context);
  current()->step();  // warm up
  for (auto _ : state) current()->step();
  const Stats st = current()->stats();
  const double per_step = static_cast<double>(st.steps) / model().config.layers;  // attend() calls per token
  state.SetLabel(fmt::format("{}: per token select {:.1f} ms, classify {:.1f}, compute {:.1f}, commit {:.1f}", sparse ? "sparse" : "dense",
                             st.time.select_ms / per_step, st.time.classify_ms / per_step, st.time.compute_ms / per_step,
                             st.time.commit_ms / per_step));
}

}  // namespace

int main(int argc, char** argv) {
  for (std::int64_t ctx : {4096, 16384, 65536, 131072})
    for (int sparse : {0, 1})
      benchmark::RegisterBenchmark("BM_DecodeStep", BM_DecodeStep)->Args({ctx, sparse})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
  benchmark::Initialize(&argc, argv);
  struct Times : benchmark::ConsoleReporter {
    std::map<std::pair<std::int64_t, int>, double> ms;
    void ReportRuns(const std::vector<Run>& runs) override {
      for (const auto& r : runs) {
        const std::string n = r.benchmark_name();  // BM_DecodeStep/CTX/SPARSE/...
        const auto a = n.find('/'), b = n.find('/', a + 1), c = n.find('/', b + 1);
        ms[{std::stoll(n.substr(a + 1, b - a - 1)), std::stoi(n.substr(b + 1, c - b - 1))}] = r.GetAdjustedRealTime();
      }
      ConsoleReporter::ReportRuns(runs);
    }
  } reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  current().reset();
  std::printf("\nOne decode step (2 Llama-3-8B-shaped layers + logits), same run:\n");
  std::printf("  %8s %12s %12s %10s\n", "context", "dense ms", "sparse ms", "speed-up");
  for (std::int64_t ctx : {4096, 16384, 65536, 131072}) {
    auto d = reporter.ms.find({ctx, 0}), s = reporter.ms.find({ctx, 1});
    if (d == reporter.ms.end() || s == reporter.ms.end()) continue;
    std::printf("  %8lld %12.1f %12.1f %9.2fx\n", static_cast<long long>(ctx), d->second, s->second, d->second / s->second);
  }
  benchmark::Shutdown();
  return 0;
}
