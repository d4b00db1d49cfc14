// kvd-longbench: long-context tasks on a real model (SmolLM2-135M-Instruct by default), every
// attention configuration on the same work. Each sample (a RULER-style task, longbench/tasks.hpp)
// is prefilled once, densely; its K/V then start every configuration (longbench/replay.hpp):
// dense, each sparse index at each budget, and tiered Hierarchical (DRAM cache + SSD), which must
// give sparse Hierarchical's tokens exactly (Decision 2: the tool checks it and fails otherwise;
// longbench/sample.hpp).
// Per cell (task, haystack, context, configuration): accuracy with its 95% interval, agreement
// with dense's answer on the same samples, N, and decode time. --fidelity measures instead how far
// each configuration's next-token distributions depart from dense's on long documents
// (longbench/fidelity.hpp). Tables on stdout (longbench/tables.hpp), everything in --json.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/gguf_loader.hpp"
#include "longbench/fidelity.hpp"
#include "longbench/replay.hpp"
#include "longbench/sample.hpp"
#include "longbench/stats.hpp"
#include "longbench/tables.hpp"
#include "longbench/tasks.hpp"
#include "model/model_cache.hpp"
#include "app/run.hpp"

using namespace kvdrive;
using namespace kvdrive::longbench;

namespace {

/// Exit status when the model is absent and --skip-without-model is given (ctest's skip code).
constexpr int kSkipped = 77;

struct Options {
  std::string model = "smollm2";
  std::vector<std::string> tasks{"all"};
  std::vector<std::int64_t> contexts{1024, 2048, 4096, 8192};
  std::vector<std::string> haystacks{"prose"};
  int samples = 6;
  std::vector<double> budgets{0.0625, 0.015625};
  std::vector<std::string> configs{"all"};
  std::uint64_t seed = 1;
  unsigned threads = 0;
  std::string json;
  std::string store_dir;
  bool quick = false;
  bool require_dense_correct = false;
  bool skip_without_model = false;
  bool fidelity = false;
  std::vector<std::string> fidelity_docs{"python", "licences"};
  std::vector<std::int64_t> positions{2048, 4096, 8160};
  int forced = 32;
  std::string record_traces;  ///< a folder: each sample's dense trace, kept where a configuration scored below dense
};

std::vector<TaskKind> chosen_tasks(const Options& o) {
  if (o.tasks.size() == 1 && o.tasks[0] == "all") return {kAllTasks.begin(), kAllTasks.end()};
  std::vector<TaskKind> out;
  for (const auto& t : o.tasks) out.push_back(parse_task(t));
  return out;
}

std::vector<ConfigSpec> chosen_configs(const Options& o) {
  if (o.configs.size() == 1 && o.configs[0] == "all") return default_configs(o.budgets);
  std::vector<ConfigSpec> out;
  for (const auto& c : o.configs) out.push_back(parse_config(c));
  KVD_EXPECT(!out.empty() && out.front() == ConfigSpec{}, "--configs: the first configuration must be dense (the others are compared with it)");
  return out;
}

/// The sample specs of the run: per context, haystack and task, `samples` depths spread over [0, 1].
std::vector<TaskSpec> plan_samples(const Options& o, const std::vector<TaskKind>& tasks) {
  std::vector<TaskSpec> out;
  for (std::int64_t ctx : o.contexts)
    for (const auto& h : o.haystacks)
      for (TaskKind t : tasks)
        for (int i = 0; i < o.samples; ++i) {
          TaskSpec s;
          s.kind = t;
          KVD_EXPECT(h == "prose" || h == "repeat", "--haystacks: '{}' (prose, repeat)", h);
          s.haystack = h == "prose" ? Haystack::prose : Haystack::repeat;
          s.context = ctx;
          s.depth = o.samples == 1 ? 0.5 : static_cast<double>(i) / (o.samples - 1);
          s.seed = o.seed * 1000003ull + static_cast<std::uint64_t>(i) * 7919ull + static_cast<std::uint64_t>(ctx);
          out.push_back(s);
        }
  return out;
}

int run_retrieval(const Options& o, const ReplayContext& cx, const Prompter& pr, nlohmann::json& report) {
  const std::vector<TaskKind> tasks = chosen_tasks(o);
  const std::vector<ConfigSpec> configs = chosen_configs(o);
  const std::vector<TaskSpec> specs = plan_samples(o, tasks);
  fmt::print("kvd-longbench: {} samples ({} per task, context and haystack) x {} configurations\n", specs.size(), o.samples, configs.size());
  llama::Progress bar("samples");
  std::vector<Sample> samples;
  int failures = 0;
  for (const auto& spec : specs) {
    samples.push_back(run_sample(cx, pr, spec, configs, o.record_traces));
    failures += check_sample(samples.back(), configs, o.require_dense_correct);
    bar.update(static_cast<std::int64_t>(samples.size()), static_cast<std::int64_t>(specs.size()));
  }
  print_tables(samples, configs, tasks);
  report["depth_bands"] = print_depth_bands(samples, configs);
  report["pooled"] = pooled_where_dense_works(samples, configs);
  report["cells"] = cells_json(samples, configs);
  report["samples"] = samples_json(samples, configs);
  report["failures"] = failures;
  return failures;
}

void run_fidelity_mode(const Options& o, const ReplayContext& cx, const Prompter& pr, nlohmann::json& report) {
  FidelityPlan plan;
  plan.docs = o.fidelity_docs;
  plan.positions = o.positions;
  plan.forced = o.forced;
  plan.configs = chosen_configs(o);
  fmt::print("kvd-longbench --fidelity: {} documents x {} positions x {} configurations, {} teacher-forced tokens each\n", plan.docs.size(),
             plan.positions.size(), plan.configs.size(), plan.forced);
  llama::Progress bar("configs");
  const auto cells =
      run_fidelity(cx, pr.tok, plan, [&](std::size_t d, std::size_t t) { bar.update(static_cast<std::int64_t>(d), static_cast<std::int64_t>(t)); });
  fmt::print("\n{:<10} {:>8} {:<26} {:>10} {:>7} {:>9} {:>9} {:>8}\n", "document", "position", "configuration", "KL (nats)", "top-1", "ppl",
             "dense ppl", "ms/tok");
  for (const auto& c : cells) {
    fmt::print("{:<10} {:>8} {:<26} {:>10.5f} {:>7.3f} {:>9.3f} {:>9.3f} {:>8.1f}\n", c.doc, c.position, c.config, c.kl, c.top1, c.ppl, c.dense_ppl,
               c.ms_per_token);
    report["fidelity"].push_back({{"document", c.doc},
                                  {"position", c.position},
                                  {"config", c.config},
                                  {"tokens", c.tokens},
                                  {"kl", c.kl},
                                  {"top1", c.top1},
                                  {"ppl", c.ppl},
                                  {"dense_ppl", c.dense_ppl},
                                  {"ms_per_token", c.ms_per_token}});
  }
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "a GGUF model with a chat template, or smollm2 (the cached SmolLM2-135M-Instruct; scripts/get-model)");
  app.add_option("--tasks", o.tasks, "all, or: niah-number niah-word multikey multivalue vt")->delimiter(',');
  app.add_option("--contexts", o.contexts, "context lengths in tokens (prompt with its chat template, plus the reply)")->delimiter(',');
  app.add_option("--haystacks", o.haystacks, "prose (the licence texts) and/or repeat (RULER's repeated sentences, a control)")->delimiter(',');
  app.add_option("--samples", o.samples, "samples per task, context and haystack (depths spread over 0-100%)")->check(CLI::Range(1, 100000));
  app.add_option("--budgets", o.budgets, "sparse budgets (fractions of the candidate pages) for --configs all")->delimiter(',');
  app.add_option("--configs", o.configs,
                 "all (dense, every sparse index and tiered:hierarchical at each budget), or a list: dense first, "
                 "then INDEX@BUDGET or tiered:hierarchical@BUDGET; hierarchical{K=V;...} sets expand, min_scored, "
                 "score_all_below, pair_radii, pair_weight, radius_weight or pages_per_cluster")
      ->delimiter(',');
  app.add_option("--seed", o.seed, "picks every sample's keys, values and haystack start");
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
  app.add_option("--json", o.json, "write every sample and cell as JSON to this file");
  app.add_option("--store-dir", o.store_dir, "tiered: the folder of the SSD store (default: the temporary directory)");
  app.add_option("--record-traces", o.record_traces,
                 "a folder: record each sample's dense prefill and reply as a trace "
                 "(kvd-llama --record-trace's format), kept where a configuration scored below dense")
      ->check(CLI::ExistingDirectory);
  app.add_flag("--quick", o.quick, "a run of a few minutes: 1K and 2K, 2 samples per task, budget 6.25%");
  app.add_flag("--require-dense-correct", o.require_dense_correct, "fail unless dense answers every sample");
  app.add_flag("--skip-without-model", o.skip_without_model, "exit 77 (a skip for ctest) when the model file is absent");
  app.add_flag("--fidelity", o.fidelity, "teacher-forced fidelity on long documents instead of the tasks");
  app.add_option("--fidelity-docs", o.fidelity_docs, "--fidelity: python (the standard library sources) and/or licences")->delimiter(',');
  app.add_option("--positions", o.positions, "--fidelity: positions measured (beyond the model's context: the limit is raised, and said)")
      ->delimiter(',');
  app.add_option("--forced", o.forced, "--fidelity: tokens stepped through at each position")->check(CLI::Range(1, 4096));
}

/// --fidelity beyond the model's trained context: the limit is raised to the last forced token's
/// position, and said.
void reach_fidelity_positions(const Options& o, llama::Model& model) {
  // The last forced token sits at position P + forced - 1.
  const std::int64_t end = *std::max_element(o.positions.begin(), o.positions.end()) + o.forced;
  if (end > model.config.max_seq) {
    fmt::print("kvd-longbench: positions up to {} run beyond the model's trained context of {} tokens\n", end - 1, model.config.max_seq);
    model.config.max_seq = static_cast<int>(end);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvd-longbench: long-context tasks and teacher-forced fidelity on a real model, every attention configuration on the same work"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (o.quick) o.contexts = {1024, 2048}, o.samples = std::min(o.samples, 2), o.budgets = {0.0625};
  try {
    if (o.model == "smollm2") {
      if (o.skip_without_model && !std::filesystem::is_regular_file(llama::model_cache_dir() / llama::kSmolLM2File)) {
        fmt::print("SKIPPED: {} is absent (run scripts/get-model)\n", (llama::model_cache_dir() / llama::kSmolLM2File).string());
        return kSkipped;
      }
      o.model = llama::smollm2_path();
    }
    ThreadPool pool(o.threads);
    llama::Model model = llama::load_gguf(o.model);
    KVD_EXPECT(model.vocab != nullptr && !model.vocab->chat_template.empty(), "{}: the tasks need a GGUF model with a chat template", o.model);
    if (o.fidelity) reach_fidelity_positions(o, model);
    ReplayContext cx;
    cx.model = &model;
    cx.pool = &pool;
    cx.layout.model.threads = o.threads;
    cx.layout.tiers.ssd_path = ((o.store_dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(o.store_dir)) /
                                fmt::format("kvd-longbench-{}.store", ::getpid()))
                                   .string();
    const Prompter pr(model);
    std::string command = "kvd-longbench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    nlohmann::json report = {{"command", command},
                             {"model", model.source},
                             {"kv_dtype", cx.layout.attention.dtype},
                             {"page_tokens", cx.layout.attention.page_tokens},
                             {"sink_tokens", cx.layout.attention.sink_tokens},
                             {"local_tokens", cx.layout.attention.local_tokens},
                             {"threads", pool.threads()}};
    fmt::print("kvd-longbench: {} ({} KV, {}-token pages, sink {}, local {}, {} threads)\n", model.source, cx.layout.attention.dtype,
               cx.layout.attention.page_tokens, cx.layout.attention.sink_tokens, cx.layout.attention.local_tokens, pool.threads());
    int failures = 0;
    if (o.fidelity) run_fidelity_mode(o, cx, pr, report);
    else failures = run_retrieval(o, cx, pr, report);
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << report.dump(1) << "\n";
      KVD_EXPECT(f.good(), "--json {}: cannot write", o.json);
    }
    if (failures > 0) fmt::print(stderr, "kvd-longbench: {} checks FAILED\n", failures);
    return failures > 0 ? 1 : 0;
  } catch (const Error& e) {
    fmt::print(stderr, "kvd-longbench: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvd-longbench: error: {}\n", e.what());
    return 1;
  }
}
