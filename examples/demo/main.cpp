// kvd-demo: sparse decoding of a long synthetic context through KvManager.
//
// K/V are generated directly (no model), with the structure that makes sparse attention work:
// keys come from a mixture of topics, each stretch of the context dwells on one topic, and each
// query head looks for a couple of topics that drift slowly from step to step. Two managers
// decode the same stream side by side: one sparse (top pages within the budget), one dense. Per
// step it prints the stage times, the pages selected and the sparse-vs-dense output error.
// (Until the selection issue brings the real indices, the sparse manager uses index::Oracle.)
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kvdrive/eval/metrics.hpp"
#include "kvdrive/kvdrive.hpp"

using namespace kvdrive;

namespace {

struct Options {
  int context = 32768;
  int layers = 2;
  int steps = 8;
  double budget = 0.0625;
  int page_tokens = 8;
  unsigned threads = 0;
  std::string dtype = "f16";
  std::uint64_t seed = 1;
};

/// The synthetic stream generator: topic directions per (layer, KV head).
class Synthetic {
 public:
  Synthetic(const ModelShape& shape, int topics, std::uint64_t seed) : shape_(shape), topics_(topics) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n;
    dirs_.resize(static_cast<std::size_t>(shape.layers) * shape.kv_heads * topics * shape.head_dim);
    for (auto& x : dirs_) x = n(rng);
  }
  const float* dir(int layer, int head, int topic) const {
    return dirs_.data() + ((static_cast<std::size_t>(layer) * shape_.kv_heads + head) * topics_ + topic) * shape_.head_dim;
  }
  /// The topic a context position dwells on: stretches of 256 tokens, shuffled.
  int topic_at(std::int64_t t) const { return static_cast<int>(((t / 256) * 2654435761u) % static_cast<std::uint64_t>(topics_)); }

  /// K and V rows for tokens [t0, t0 + n) of one layer: [n][kv_heads][head_dim].
  void kv(int layer, std::int64_t t0, std::int64_t n, std::vector<float>& k, std::vector<float>& v, std::mt19937_64& rng) const {
    std::normal_distribution<float> noise;
    const int d = shape_.head_dim, kvh = shape_.kv_heads;
    k.resize(static_cast<std::size_t>(n) * kvh * d);
    v.resize(k.size());
    for (std::int64_t i = 0; i < n; ++i)
      for (int h = 0; h < kvh; ++h) {
        const float* topic = dir(layer, h, topic_at(t0 + i));
        float* kr = k.data() + (static_cast<std::size_t>(i) * kvh + h) * d;
        float* vr = v.data() + (static_cast<std::size_t>(i) * kvh + h) * d;
        for (int j = 0; j < d; ++j) {
          kr[j] = 1.5f * topic[j] + 0.5f * noise(rng);
          vr[j] = noise(rng);
        }
      }
  }

  /// Queries of one layer at a decode step: each head mixes two topics, drifting with the step.
  void queries(int layer, int step, std::vector<float>& q, std::mt19937_64& rng) const {
    std::normal_distribution<float> noise;
    const int d = shape_.head_dim, g = shape_.group();
    q.resize(static_cast<std::size_t>(shape_.q_heads) * d);
    for (int qh = 0; qh < shape_.q_heads; ++qh) {
      const int a = (qh * 7 + step / 4) % topics_, b = (qh * 13 + 5 + step / 6) % topics_;
      const float* ta = dir(layer, qh / g, a);
      const float* tb = dir(layer, qh / g, b);
      for (int j = 0; j < d; ++j) q[static_cast<std::size_t>(qh) * d + j] = 0.8f * ta[j] + 0.4f * tb[j] + 0.2f * noise(rng);
    }
  }

 private:
  ModelShape shape_;
  int topics_;
  std::vector<float> dirs_;
};

using Sparse = KvManager<index::Oracle, eviction::Lru>;
using Dense = KvManager<index::Dense, eviction::Lru>;

Config demo_config(const Options& o) {
  Config cfg;
  cfg.shape = {o.layers, 32, 8, 128};  // Llama-3-8B's attention shape
  cfg.page_tokens = o.page_tokens;
  cfg.dtype = o.dtype == "f32" ? DType::f32 : o.dtype == "bf16" ? DType::bf16 : DType::f16;
  cfg.budget = Budget::fraction(o.budget);
  return cfg;
}

/// Both managers' statistics over the decode steps, and the sparse output's error against dense.
struct Totals {
  Stats sparse, dense;
  double worst_error = 0, sum_error = 0;
};

/// The two managers fed the same synthetic stream: one sparse, one dense.
class Demo {
 public:
  explicit Demo(const Options& o)
      : o_(o),
        cfg_(demo_config(o)),
        sparse_(cfg_, {}, {}, {}, {}, backend::Cpu({o.threads})),
        dense_(cfg_, {}, {}, {}, {}, backend::Cpu({o.threads})),
        gen_(cfg_.shape, 64, o.seed) {}

  void print_header() const {
    const auto& sh = cfg_.shape;
    fmt::print("kvd-demo: {} layers x {} query heads / {} KV heads x head_dim {}, {} KV, {}-token pages\n", sh.layers, sh.q_heads, sh.kv_heads,
               sh.head_dim, dtype_name(cfg_.dtype), cfg_.page_tokens);
    fmt::print("context {} tokens, budget {:.2f}% of candidate pages (+{} sink, {} local tokens), {} threads\n", o_.context, 100 * o_.budget,
               cfg_.sink_tokens, cfg_.local_tokens, backend::Cpu({o_.threads}).threads());
  }

  /// The whole context into both managers, layer by layer in chunks.
  void prefill() {
    const auto& sh = cfg_.shape;
    const auto t_prefill = std::chrono::steady_clock::now();
    s_id_ = sparse_.add_sequence(), d_id_ = dense_.add_sequence();
    const std::int64_t chunk = 4096;
    for (int l = 0; l < sh.layers; ++l)
      for (std::int64_t t0 = 0; t0 < o_.context; t0 += chunk) {
        const std::int64_t n = std::min<std::int64_t>(chunk, o_.context - t0);
        gen_.kv(l, t0, n, k_, v_, rng_);
        sparse_.prefill(s_id_, l, make_view(k_, n, sh.kv_heads, sh.head_dim), make_view(v_, n, sh.kv_heads, sh.head_dim));
        dense_.prefill(d_id_, l, make_view(k_, n, sh.kv_heads, sh.head_dim), make_view(v_, n, sh.kv_heads, sh.head_dim));
      }
    const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_prefill).count();
    const double kv_mib =
        static_cast<double>(o_.context) * sh.layers * sh.kv_heads * static_cast<double>(cfg_.page_bytes()) / cfg_.page_tokens / (1 << 20);
    fmt::print("prefill: {:.1f} s (generating and storing {:.0f} MiB of KV per manager)\n\n", prefill_s, kv_mib);
  }

  /// --steps decode steps, a line of the table each.
  Totals decode() {
    fmt::print("{:>4}  {:>9} {:>9} {:>9} {:>9}  {:>10} {:>9}  {:>9}  {:>10}\n", "step", "select", "compute", "other", "sparse", "pages/strm",
               "attended", "dense", "rel. error");
    fmt::print("{:>4}  {:>9} {:>9} {:>9} {:>9}  {:>10} {:>9}  {:>9}  {:>10}\n", "", "ms", "ms", "ms", "ms", "selected", "tokens", "ms", "vs dense");
    const auto& sh = cfg_.shape;
    out_s_.resize(static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
    out_d_.resize(out_s_.size());
    Totals total;
    for (int step = 0; step < o_.steps; ++step) {
      Stats ss, ds;
      const double step_error = decode_step(step, ss, ds);
      const double other = ss.time.classify_ms + ss.time.fetch_ms + ss.time.commit_ms;
      fmt::print("{:>4}  {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f}  {:>10.1f} {:>9.0f}  {:>9.2f}  {:>10.2e}\n", step, ss.time.select_ms, ss.time.compute_ms,
                 other, ss.time.total_ms(), static_cast<double>(ss.selected) / static_cast<double>(ss.streams),
                 static_cast<double>(ss.attended_tokens) / static_cast<double>(ss.streams), ds.time.total_ms(), step_error);
      total.sparse += ss;
      total.dense += ds;
      total.worst_error = std::max(total.worst_error, step_error);
      total.sum_error += step_error;
    }
    return total;
  }

  void print_summary(const Totals& t) const {
    const Stats& sparse_total = t.sparse;
    const Stats& dense_total = t.dense;
    fmt::print("\nsummary over {} steps x {} layers:\n", o_.steps, cfg_.shape.layers);
    fmt::print("  pages selected per stream: {:.1f} of {:.1f} candidates ({:.2f}%)\n",
               static_cast<double>(sparse_total.selected) / static_cast<double>(sparse_total.streams),
               static_cast<double>(sparse_total.candidates) / static_cast<double>(sparse_total.streams),
               100.0 * static_cast<double>(sparse_total.selected) / static_cast<double>(sparse_total.candidates));
    fmt::print("  tokens attended per stream: {:.0f} sparse vs {:.0f} dense\n",
               static_cast<double>(sparse_total.attended_tokens) / static_cast<double>(sparse_total.streams),
               static_cast<double>(dense_total.attended_tokens) / static_cast<double>(dense_total.streams));
    fmt::print("  attention compute: {:.2f} ms sparse vs {:.2f} ms dense per step ({:.1f}x less)\n", sparse_total.time.compute_ms / o_.steps,
               dense_total.time.compute_ms / o_.steps, dense_total.time.compute_ms / std::max(1e-9, sparse_total.time.compute_ms));
    fmt::print("  selection (exact oracle, scans every key): {:.2f} ms per step\n", sparse_total.time.select_ms / o_.steps);
    fmt::print("  sparse vs dense relative output error: mean {:.2e}, worst {:.2e}\n", t.sum_error / o_.steps, t.worst_error);
    fmt::print("  index size: {:.1f} MiB (the oracle keeps every key in float)\n", static_cast<double>(sparse_.index_bytes()) / (1 << 20));
  }

 private:
  /// One decode step through every layer of both managers: their statistics into ss and ds; returns
  /// the step's worst relative error of the sparse output against the dense one.
  double decode_step(int step, Stats& ss, Stats& ds) {
    const auto& sh = cfg_.shape;
    const SeqId sb[] = {s_id_}, db[] = {d_id_};
    double step_error = 0;
    for (int l = 0; l < sh.layers; ++l) {
      gen_.queries(l, step, q_, rng_);
      gen_.kv(l, o_.context + step, 1, k_, v_, rng_);
      const auto qv = make_view(q_, 1, sh.q_heads, sh.head_dim);
      const auto kv1 = make_view(k_, 1, sh.kv_heads, sh.head_dim), vv1 = make_view(v_, 1, sh.kv_heads, sh.head_dim);
      sparse_.attend(l, sb, qv, kv1, vv1, make_view(out_s_, 1, sh.q_heads, sh.head_dim));
      dense_.attend(l, db, qv, kv1, vv1, make_view(out_d_, 1, sh.q_heads, sh.head_dim));
      ss += sparse_.last_stats();
      ds += dense_.last_stats();
      step_error = std::max(step_error, eval::relative_error(out_s_, out_d_));
    }
    return step_error;
  }

  Options o_;
  Config cfg_;
  Sparse sparse_;
  Dense dense_;
  Synthetic gen_;
  std::mt19937_64 rng_{o_.seed + 1};
  SeqId s_id_ = 0, d_id_ = 0;
  std::vector<float> k_, v_, q_, out_s_, out_d_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvd-demo: sparse decoding of a long synthetic context through kvdrive::KvManager"};
  app.add_option("--context", o.context, "prompt tokens per sequence")->check(CLI::Range(1, 1 << 22));
  app.add_option("--layers", o.layers, "layers")->check(CLI::Range(1, 128));
  app.add_option("--steps", o.steps, "decode steps")->check(CLI::Range(1, 100000));
  app.add_option("--budget", o.budget, "sparse budget as a fraction of the candidate pages, in (0, 1]");
  app.add_option("--page-tokens", o.page_tokens, "tokens per page")->check(CLI::Range(1, 4096));
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
  app.add_option("--dtype", o.dtype, "KV dtype")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--seed", o.seed, "random seed");
  CLI11_PARSE(app, argc, argv);

  try {
    Demo demo(o);
    demo.print_header();
    demo.prefill();
    demo.print_summary(demo.decode());
  } catch (const Error& e) {
    fmt::print(stderr, "kvd-demo: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
