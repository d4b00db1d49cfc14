// bench_pipeline: pipeline::Elastic against pipeline::Serial on DRAM cache + SSD backing with real
// I/O (SsdTier, O_DIRECT, io_uring; no sleeps stand in for it), and both against DRAM only.
// For each (context, batch): `batch` sequences of the synthetic trace `default` (seed 1, 2, ...;
// one layer, `--kv-heads` KV heads of it), the Hierarchical index at a 6.25% budget, a Lookahead
// W=3 cache, warm-up placement after prefill. Three KvManagers run the same steps in turns:
//   serial   Tiers<HostTier, SsdTier>, pipeline::Serial
//   elastic  Tiers<HostTier, SsdTier>, pipeline::Elastic (its own store, same layout)
//   dram     Tiers<HostTier> (everything in DRAM), pipeline::Serial
// and it prints per-step wall times, the ideal max(select, classify, fetch) + compute + commit +
// the pipeline fill ((select + classify) / micro-batches), all from Serial's stage times, and the
// ratios. Step times are the medians over `--steps` decode steps.
//
//   bench_pipeline [--dir PATH] [--contexts 32768,131072] [--batches 1,4,8] [--steps N]
//                  [--kv-heads N] [--micro-batch N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "kvdrive/eval/layer_inputs.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/kvdrive.hpp"

using namespace kvdrive;
using namespace kvdrive::tier;

namespace {

struct Options {
  std::string dir = std::filesystem::temp_directory_path().string();
  std::vector<std::int64_t> contexts = {32768, 131072};
  std::vector<int> batches = {1, 4, 8};
  int steps = 24;
  int kv_heads = 2;
  std::size_t micro_batch = 0;
  std::string json;
};

std::vector<std::int64_t> parse_list(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::strtoll(item.c_str(), nullptr, 10));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using SsdTiers = Tiers<HostTier, SsdTier>;
using SerialKv = KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers, pipeline::Serial>;
using ElasticKv = KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers, pipeline::Elastic>;
using DramKv = KvManager<index::Hierarchical, eviction::Lookahead, Tiers<HostTier>, pipeline::Serial>;

/// The three managers of one case, each holding the batch's sequences (in the batch's order).
struct Managers {
  SerialKv serial;
  ElasticKv elastic;
  DramKv dram;
  std::vector<SeqId> ids_s, ids_e, ids_d;
};

/// The managers of a case: Serial and Elastic over their own SsdTier stores (in --dir, removed when
/// they close), and DRAM only.
Managers make_managers(const Options& o, const Config& c) {
  auto store = [&](const char* name) {
    SsdTier::Params p;
    p.path = (std::filesystem::path(o.dir) / fmt::format("kvd_bench_pipeline_{}.store", name)).string();
    p.mode = tier::SsdOpen::recreate;
    p.delete_on_close = true;
    return p;
  };
  const SsdTier::Params serial_store = store("serial"), elastic_store = store("elastic");
  return Managers{SerialKv(c, {}, eviction::Lookahead{3}, SsdTiers(HostTier{}, SsdTier(serial_store))),
                  ElasticKv(c, {}, eviction::Lookahead{3}, SsdTiers(HostTier{}, SsdTier(elastic_store)), pipeline::Elastic({o.micro_batch})),
                  DramKv(c, {}, eviction::Lookahead{3}),
                  {},
                  {},
                  {}};
}

/// The batch's sequences (the trace `default`, seed 1, 2, ...) prefilled into every manager and
/// warmed up; returns each one's decode steps (the prompt is in the managers now).
std::vector<eval::LayerInputs> load_batch(const Options& o, std::int64_t context, int batch, Managers& m) {
  const eval::SyntheticPreset preset = eval::synthetic_preset("default");
  std::vector<eval::LayerInputs> inputs;
  for (int b = 0; b < batch; ++b) {
    const eval::SyntheticTrace trace(preset, static_cast<std::uint64_t>(b + 1), context, o.steps);
    eval::LayerInputs& in = inputs.emplace_back(eval::layer_inputs(trace, 0, o.kv_heads));
    auto load = [&](auto& kv, std::vector<SeqId>& ids) {
      ids.push_back(kv.add_sequence());
      kv.prefill(ids.back(), 0, in.prompt_k(), in.prompt_v());
      kv.warm_up(ids.back(), 0, in.observation_queries());
    };
    load(m.serial, m.ids_s);
    load(m.elastic, m.ids_e);
    load(m.dram, m.ids_d);
    in.k = {};  // the prompt is in the managers now
    in.v = {};
  }
  return inputs;
}

/// One step's queries, keys, values and outputs for the whole batch.
struct StepBuffers {
  int batch, qh, kvh, d;
  std::vector<float> q, k, v, out;

  StepBuffers(int batch_, int qh_, int kvh_, int d_)
      : batch(batch_),
        qh(qh_),
        kvh(kvh_),
        d(d_),
        q(static_cast<std::size_t>(batch) * qh * d),
        k(static_cast<std::size_t>(batch) * kvh * d),
        v(k.size()),
        out(q.size()) {}
  /// f(q, k, v, out) on the step's views: KvManager::attend's or tune's arguments after the sequences.
  template <class F>
  decltype(auto) with_views(F&& f) {
    return f(make_view(q, batch, qh, d), make_view(k, batch, kvh, d), make_view(v, batch, kvh, d), make_view(out, batch, qh, d));
  }
};

/// Per-step figures of one case: each manager's wall time, the ideal step and the select + fetch
/// share of Serial's wall time, both from Serial's stage times; the stage times summed.
struct Measured {
  std::vector<double> t_serial, t_elastic, t_dram, ideal, share;
  StageTimes es, ss;
};

/// Every decode step through the three managers, in turns.
Measured measure_steps(const Options& o, Managers& m, const std::vector<eval::LayerInputs>& inputs, StepBuffers& b, std::size_t streams,
                       std::size_t mb) {
  Measured r;
  for (int s = 0; s < o.steps; ++s) {
    eval::batch_step(inputs, s, b.q, b.k, b.v);
    auto timed = [&](auto& kv, const std::vector<SeqId>& ids) {
      const auto t0 = std::chrono::steady_clock::now();
      b.with_views([&](auto q, auto k, auto v, auto out) { kv.attend(0, ids, q, k, v, out); });
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    r.t_serial.push_back(timed(m.serial, m.ids_s));
    r.t_elastic.push_back(timed(m.elastic, m.ids_e));
    r.t_dram.push_back(timed(m.dram, m.ids_d));
    const StageTimes& st = m.serial.last_stats().time;
    const double micro = static_cast<double>((streams + mb - 1) / mb);
    r.ideal.push_back(std::max({st.select_ms, st.classify_ms, st.fetch_ms}) + st.compute_ms + st.commit_ms + (st.select_ms + st.classify_ms) / micro);
    r.share.push_back((st.select_ms + st.fetch_ms) / std::max(1e-9, st.wall_ms));
    r.es += m.elastic.last_stats().time;
    r.ss += st;
  }
  return r;
}

/// The case's row of the table and its two lines of stage times; returns its JSON row.
nlohmann::json print_case(const Options& o, std::int64_t context, int batch, const Managers& m, const Measured& r, std::size_t streams,
                          std::size_t mb) {
  const StageTimes &es = r.es, &ss = r.ss;
  const double ms_s = median(r.t_serial), ms_e = median(r.t_elastic), ms_d = median(r.t_dram), ms_i = median(r.ideal);
  std::printf("%8lld %6d %5zu/%-3zu %7.1f%% %9.3f %9.3f %9.3f %9.3f %8.2fx %8.2f %8.0f%% %8.2f   %.2f/%.2f/%.2f\n", static_cast<long long>(context),
              batch, streams, mb, 100 * m.elastic.total_stats().hit_rate(), ms_s, ms_e, ms_i, ms_d, ms_s / ms_e, ms_e / ms_i, 100 * median(r.share),
              ms_e / ms_d, es.select_bubble(), es.classify_bubble(), es.fetch_bubble());
  const double n_steps = o.steps;
  std::printf("%26s serial stages (mean ms): select %.3f, classify %.3f, fetch %.3f, compute %.3f, commit %.3f; misses/step %.1f\n", "",
              ss.select_ms / n_steps, ss.classify_ms / n_steps, ss.fetch_ms / n_steps, ss.compute_ms / n_steps, ss.commit_ms / n_steps,
              static_cast<double>(m.serial.total_stats().misses) / n_steps);
  std::printf(
      "%26s elastic stages (mean ms): select %.3f, classify %.3f, fetch %.3f (waited %.3f), compute %.3f, commit %.3f; "
      "overlapped phase %.3f, wall %.3f\n",
      "", es.select_ms / n_steps, es.classify_ms / n_steps, es.fetch_ms / n_steps, es.fetch_wait_ms / n_steps, es.compute_ms / n_steps,
      es.commit_ms / n_steps, es.overlap_ms / n_steps, es.wall_ms / n_steps);
  std::fflush(stdout);
  return {{"context", context}, {"batch", batch},     {"streams", streams}, {"micro_batch", mb}, {"hit_rate", m.elastic.total_stats().hit_rate()},
          {"serial_ms", ms_s},  {"elastic_ms", ms_e}, {"ideal_ms", ms_i},   {"dram_ms", ms_d},   {"select_fetch_share", median(r.share)}};
}

nlohmann::json run_case(const Options& o, std::int64_t context, int batch) {
  const eval::SyntheticPreset preset = eval::synthetic_preset("default");
  const int kvh = o.kv_heads, d = preset.shape.head_dim, g = preset.shape.q_heads / preset.shape.kv_heads, qh = g * kvh;
  Config c;
  c.shape = {1, qh, kvh, d};
  c.budget = Budget::fraction(0.0625);
  Managers m = make_managers(o, c);
  const std::vector<eval::LayerInputs> inputs = load_batch(o, context, batch, m);
  StepBuffers b(batch, qh, kvh, d);
  // Elastic's micro-batch: given, or tuned on dry runs of the first step.
  if (o.micro_batch == 0) {
    eval::batch_step(inputs, 0, b.q, b.k, b.v);
    b.with_views([&](auto q, auto k, auto v, auto out) { m.elastic.tune(0, m.ids_e, q, k, v, out); });
  }
  const std::size_t streams = static_cast<std::size_t>(batch * kvh), mb = m.elastic.pipeline_policy().micro_batch_for(streams);
  const Measured r = measure_steps(o, m, inputs, b, streams, mb);
  nlohmann::json row = print_case(o, context, batch, m, r, streams, mb);
  for (SeqId id : m.ids_s) m.serial.release(id);
  for (SeqId id : m.ids_e) m.elastic.release(id);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") o.dir = argv[i + 1];
    else if (a == "--contexts") o.contexts = parse_list(argv[i + 1]);
    else if (a == "--batches") {
      o.batches.clear();
      for (std::int64_t b : parse_list(argv[i + 1])) o.batches.push_back(static_cast<int>(b));
    } else if (a == "--steps") o.steps = std::atoi(argv[i + 1]);
    else if (a == "--kv-heads") o.kv_heads = std::atoi(argv[i + 1]);
    else if (a == "--micro-batch") o.micro_batch = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--json") o.json = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_pipeline: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    KVD_EXPECT(!o.contexts.empty() && !o.batches.empty() && o.steps >= 1 && o.kv_heads >= 1 && o.kv_heads <= 8,
               "bench_pipeline: bad options (--kv-heads 1..8, --steps >= 1)");
    for (std::int64_t c : o.contexts) KVD_EXPECT(c >= 1024, "bench_pipeline: context {} < 1024", c);
    for (int b : o.batches) KVD_EXPECT(b >= 1 && b <= 64, "bench_pipeline: batch {} outside 1..64", b);
    std::printf(
        "bench_pipeline: one layer of %d KV heads (synthetic `default`), hierarchical at 6.25%%, Lookahead W=3, warm-up; "
        "DRAM cache + SsdTier in %s; medians of %d steps; ms per layer step\n",
        o.kv_heads, o.dir.c_str(), o.steps);
    std::printf("%8s %6s %9s %8s %9s %9s %9s %9s %9s %8s %9s %8s   %s\n", "context", "batch", "streams/mb", "hit", "serial", "elastic", "ideal",
                "dram", "ser/ela", "ela/idl", "sel+fet", "ela/dram", "bubbles sel/cls/fet");
    nlohmann::json rows = nlohmann::json::array();
    for (std::int64_t c : o.contexts)
      for (int b : o.batches) rows.push_back(run_case(o, c, b));
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << nlohmann::json{{"kv_heads", o.kv_heads}, {"steps", o.steps}, {"rows", rows}}.dump(2) << "\n";
      KVD_EXPECT(f.good(), "bench_pipeline: cannot write {}", o.json);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
  return 0;
}
