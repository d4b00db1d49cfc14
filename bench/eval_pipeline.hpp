// kvd-eval --pipeline: the trace's first --pipeline-layers layers decoded through KvManager
// (hierarchical, Lookahead, DRAM cache + SsdTier) by each pipeline, step by step, and the stage
// statistics of each: busy time per stage, the waits between stages, and the bubble fraction of
// each stage in the overlapped phase.
#pragma once

#include <unistd.h>  // getpid

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "eval_options.hpp"
#include "kvdrive/eval/layer_inputs.hpp"
#include "kvdrive/research.hpp"

namespace kvdrive::kvd_eval {

/// The replay's layers prefilled into kv (and warmed up, with --warm-up on); returns each layer's
/// decode steps (the prompt is in kv now).
template <class Kv, class Source>
std::vector<eval::LayerInputs> load_layers(Kv& kv, SeqId id, const Source& source, const Options& o) {
  std::vector<eval::LayerInputs> layers;
  for (int l = 0; l < o.pipeline_layers; ++l) {
    eval::LayerInputs& in = layers.emplace_back(eval::layer_inputs(source, l));
    kv.prefill(id, l, in.prompt_k(), in.prompt_v());
    if (o.warm_up == "on" && in.observed > 0) kv.warm_up(id, l, in.observation_queries());
    in.k = {};
    in.v = {};
  }
  return layers;
}

/// What a replay measured: each layer step's wall time, and the micro-batch Elastic tuned on the
/// first (0 for Serial).
struct PipelineSteps {
  std::vector<double> step_ms;
  std::size_t micro_batch = 0;
};

/// Every decode step of every replayed layer through kv, timed.
template <class Pipeline, class Kv>
PipelineSteps decode_layers(Kv& kv, SeqId id, const std::vector<eval::LayerInputs>& layers, const ModelShape& full, const Options& o) {
  const int qh = full.q_heads, kvh = full.kv_heads, d = full.head_dim;
  std::vector<float> out(static_cast<std::size_t>(qh) * d);
  const SeqId batch[] = {id};
  PipelineSteps r;
  for (std::int64_t s = 0; s < o.steps; ++s)
    for (int l = 0; l < o.pipeline_layers; ++l) {
      const eval::LayerInputs& in = layers[static_cast<std::size_t>(l)];
      const auto q = View<const float, 3>(make_view(in.q(s), 1, qh, d)), k = View<const float, 3>(make_view(in.k_new(s), 1, kvh, d)),
                 v = View<const float, 3>(make_view(in.v_new(s), 1, kvh, d));
      if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>)
        if (s == 0 && l == 0) r.micro_batch = kv.tune(l, batch, q, k, v, make_view(out, 1, qh, d)).micro_batch;
      const auto t0 = std::chrono::steady_clock::now();
      kv.attend(l, batch, q, k, v, make_view(out, 1, qh, d));
      r.step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  return r;
}

/// A replay's row of the pipeline table, printed and as JSON: the median step, the stages' mean
/// busy and waiting ms per step, the bubbles and the hit rate.
template <class Pipeline>
nlohmann::json pipeline_row(PipelineSteps r, const Stats& st) {
  std::vector<double>& step_ms = r.step_ms;
  const std::size_t micro_batch = r.micro_batch;
  std::sort(step_ms.begin(), step_ms.end());
  const StageTimes& t = st.time;
  const double n = static_cast<double>(std::max<std::uint64_t>(1, st.steps));
  const double median = step_ms.empty() ? 0.0 : step_ms[step_ms.size() / 2];
  fmt::print("{:<9} {:>6} {:>9.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>9.3f} {:>9.3f} {:>6.2f}/{:.2f}/{:.2f} {:>8.1f}%\n",
             Pipeline::name(), micro_batch ? std::to_string(micro_batch) : std::string("-"), median, t.select_ms / n, t.classify_ms / n,
             t.fetch_ms / n, t.compute_ms / n, t.commit_ms / n, t.classify_wait_ms / n, t.fetch_wait_ms / n, t.select_bubble(), t.classify_bubble(),
             t.fetch_bubble(), 100 * st.hit_rate());
  return {{"pipeline", Pipeline::name()},
          {"micro_batch", micro_batch},
          {"step_ms_median", median},
          {"select_ms", t.select_ms / n},
          {"classify_ms", t.classify_ms / n},
          {"fetch_ms", t.fetch_ms / n},
          {"compute_ms", t.compute_ms / n},
          {"commit_ms", t.commit_ms / n},
          {"classify_wait_ms", t.classify_wait_ms / n},
          {"fetch_wait_ms", t.fetch_wait_ms / n},
          {"overlap_ms", t.overlap_ms / n},
          {"bubble", {{"select", t.select_bubble()}, {"classify", t.classify_bubble()}, {"fetch", t.fetch_bubble()}}},
          {"hit_rate", st.hit_rate()}};
}

/// One pipeline's replay: the trace's first layers decoded through a KvManager on DRAM cache +
/// SsdTier, step by step, with the pipeline's stage statistics.
template <class Pipeline, class Source>
nlohmann::json run_pipeline(const Source& source, const Options& o, const eval::EvalSettings& set, const std::string& dir) {
  using Ssd = Tiers<tier::HostTier, tier::SsdTier>;
  const ModelShape full = source.shape();
  const Config c = manager_config({o.pipeline_layers, full.q_heads, full.kv_heads, full.head_dim}, set);
  tier::SsdTier::Params sp;
  sp.path = (std::filesystem::path(dir) / fmt::format("kvd-eval-{}-{}.store", Pipeline::name(), ::getpid())).string();
  sp.mode = tier::SsdOpen::recreate;
  sp.delete_on_close = true;
  const index::HierarchicalParams hp = hierarchical_params(o);
  const int w = o.window == "knapsack" ? 3 : std::stoi(o.window);
  KvManager<index::Hierarchical, eviction::Lookahead, Ssd, Pipeline> kv(c, index::Hierarchical{hp}, eviction::Lookahead{w},
                                                                        Ssd(tier::HostTier{}, tier::SsdTier(sp)));
  const SeqId id = kv.add_sequence();
  const std::vector<eval::LayerInputs> layers = load_layers(kv, id, source, o);
  return pipeline_row<Pipeline>(decode_layers<Pipeline>(kv, id, layers, full, o), kv.total_stats());
}

/// The pipeline table: each pipeline's replay of the trace's first layers.
template <class Source>
nlohmann::json run_pipelines(const Source& source, const Options& o, const eval::EvalSettings& set) {
  KVD_EXPECT(o.pipeline_layers <= source.shape().layers, "--pipeline-layers {}: the trace has {} layers", o.pipeline_layers, source.shape().layers);
  const std::string dir = o.store_dir.empty() ? std::filesystem::temp_directory_path().string() : o.store_dir;
  fmt::print(
      "\npipeline: layers 0..{} decoded through KvManager (hierarchical, Lookahead W={}, warm-up {}) on DRAM cache + SsdTier "
      "in {}; per layer step: median wall, stage busy ms and waits, bubbles of the overlapped phase\n",
      o.pipeline_layers - 1, o.window == "knapsack" ? 3 : std::stoi(o.window), o.warm_up, dir);
  fmt::print("{:<9} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>16} {:>9}\n", "pipeline", "micro", "step_ms", "select", "classify",
             "fetch", "compute", "commit", "cls_wait", "fet_wait", "bubble s/c/f", "hit_rate");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : split_names(o.pipeline, {"serial", "elastic"}, "--pipeline"))
    rows.push_back(name == "serial" ? run_pipeline<pipeline::Serial>(source, o, set, dir) : run_pipeline<pipeline::Elastic>(source, o, set, dir));
  return rows;
}

}  // namespace kvdrive::kvd_eval
