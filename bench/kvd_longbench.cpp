// kvd-longbench: long-context tasks on a real model (SmolLM2-135M-Instruct by default), every
// attention configuration on the same work. Each sample (a RULER-style task, longbench/tasks.hpp)
// is prefilled once, densely; its K/V then start every configuration (longbench/replay.hpp):
// dense, each sparse index at each budget, and tiered Hierarchical (DRAM cache + SSD), which must
// give sparse Hierarchical's tokens exactly (Decision 2: the tool checks it and fails otherwise).
// Per cell (task, haystack, context, configuration): accuracy with its 95% interval, agreement
// with dense's answer on the same samples, N, and decode time. --fidelity measures instead how far
// each configuration's next-token distributions depart from dense's on long documents
// (longbench/fidelity.hpp). Tables on stdout, everything in --json.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "chat.hpp"
#include "gguf_loader.hpp"
#include "longbench/fidelity.hpp"
#include "longbench/replay.hpp"
#include "longbench/stats.hpp"
#include "longbench/tasks.hpp"
#include "model_cache.hpp"
#include "run.hpp"
#include "tokenizer.hpp"

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

/// One configuration's result on one sample.
struct Answer {
  std::vector<int> ids;
  std::string text;
  double score = 0;
  bool same_tokens = false;  ///< the same tokens as dense's reply
  bool same_bits = false;    ///< the same logits as dense's, bit for bit, at every step
  double ms_per_token = 0;
  double pages_per_step = 0;  ///< index-selected pages per stream and step
};

struct Sample {
  TaskSpec spec;
  std::int64_t prompt_tokens = 0, document_tokens = 0;
  double prefill_ms = 0;
  std::vector<std::string> answers;
  std::vector<Answer> by_config;  ///< in the order of the run's configurations
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

/// The model's tokenizer and chat template, and the prompt of a task as token ids.
struct Prompter {
  llama::Tokenizer tok;
  llama::ChatTemplate chat;

  explicit Prompter(const llama::Model& m) : tok(*m.vocab), chat(llama::ChatTemplate::from_gguf(m.vocab->chat_template)) {}
  std::vector<int> ids(const std::string& user, const std::string& reply_prefix) const {
    const std::string text = chat.render({{"user", user}}, reply_prefix);
    return tok.encode(text, tok.adds_bos(text), true);
  }
  std::string text(const std::vector<int>& ids, int before) const {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) s += tok.decode(i ? ids[i - 1] : before, ids[i]);
    return s;
  }
};

/// Where --record-traces puts a sample's trace.
std::filesystem::path trace_path(const std::string& dir, const TaskSpec& spec) {
  return std::filesystem::path(dir) / fmt::format("{}-{}-{}-{}.trace", task_name(spec.kind), haystack_name(spec.haystack), spec.context, spec.seed);
}

/// Every configuration on one sample. With a trace folder, the dense prefill and dense's reply are
/// recorded (eval::TraceWriter; scripts/analysis/page-summaries/misses.py reads them); the trace
/// is kept only where some configuration scored below dense.
Sample run_sample(const ReplayContext& cx, const Prompter& pr, const TaskSpec& spec, const std::vector<ConfigSpec>& configs,
                  const std::string& trace_dir = {}) {
  const Task task = make_task(spec, [&](const std::string& u, const std::string& r) { return static_cast<std::int64_t>(pr.ids(u, r).size()); },
                              [&](const std::string& s) { return static_cast<std::int64_t>(pr.tok.encode(s, false).size()); });
  const std::vector<int> ids = pr.ids(task.user, task.reply_prefix);
  Sample s;
  s.spec = spec;
  s.prompt_tokens = static_cast<std::int64_t>(ids.size());
  s.document_tokens = task.document_tokens;
  s.answers = task.answers;
  const std::vector<int> stops = pr.tok.stops();
  ReplayPlan plan;
  plan.max_new = reply_tokens(spec.kind);
  plan.stops = stops;
  llama::PrefillSnapshot snap;
  {
    const auto t0 = std::chrono::steady_clock::now();
    const Config cfg = llama::manager_config(cx.layout, cx.model->config);
    KvManager<index::Dense, eviction::None> kv(cfg);
    llama::Decoder<decltype(kv)> dec(*cx.model, kv, *cx.pool, cx.layout.prefill_chunk);
    std::optional<eval::TraceWriter> trace;
    if (!trace_dir.empty()) {
      trace.emplace(trace_path(trace_dir, spec).string(), cfg.shape, cfg.dtype);
      dec.record(&*trace);
    }
    dec.warm_up_after_prefill(cx.layout.warm_up);  // the queries tiered placement ranks pages by
    dec.keep_prefill(&snap);
    const std::vector<float>& first = dec.prefill(ids);
    s.prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (trace) {
      ReplayPlan dense_reply = plan;
      dense_reply.keep_logits = false;
      (void)detail::decode(dec, first, dense_reply);
      trace->close();
    }
  }
  Replay dense;
  for (const auto& c : configs) {
    Replay r = replay(cx, c, snap, plan);
    if (c == ConfigSpec{}) dense = r;
    Answer a;
    a.text = task.reply_prefix + pr.text(r.ids, ids.back());
    a.score = score(task, a.text.substr(task.reply_prefix.size()));
    a.same_tokens = r.ids == dense.ids;
    a.same_bits = same_bits(r, dense);
    a.ms_per_token = r.decode_ms / static_cast<double>(std::max<std::int64_t>(1, r.steps));
    a.pages_per_step = r.selected_per_stream;
    a.ids = std::move(r.ids);
    s.by_config.push_back(std::move(a));
  }
  if (!trace_dir.empty() &&
      std::none_of(s.by_config.begin(), s.by_config.end(), [&](const Answer& a) { return a.score < s.by_config[0].score; }))
    std::filesystem::remove(trace_path(trace_dir, spec));
  return s;
}

/// Decision 2 and the bit-for-bit oracle, checked on every sample: tiered Hierarchical gives
/// sparse Hierarchical's tokens, OracleMass at budget 1 gives dense's logits; with
/// --require-dense-correct, dense answers every sample. Returns the failures, each said on stderr.
int check_sample(const Sample& s, const std::vector<ConfigSpec>& configs, bool require_dense) {
  int failures = 0;
  const auto where = [&] { return fmt::format("{} {} {} tokens seed {}", task_name(s.spec.kind), haystack_name(s.spec.haystack), s.spec.context, s.spec.seed); };
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const ConfigSpec& c = configs[i];
    if (c.tiered)
      for (std::size_t j = 0; j < configs.size(); ++j)
        if (!configs[j].tiered && configs[j].index == c.index && configs[j].params == c.params && configs[j].budget == c.budget &&
            s.by_config[i].ids != s.by_config[j].ids) {
          fmt::print(stderr, "kvd-longbench: FAILED: {} decoded other tokens than {} ({})\n", c.name(), configs[j].name(), where());
          ++failures;
        }
    if (c.index == "oracle-mass" && c.budget == 1.0 && !s.by_config[i].same_bits) {
      fmt::print(stderr, "kvd-longbench: FAILED: oracle-mass@1 is not dense bit for bit ({})\n", where());
      ++failures;
    }
  }
  if (require_dense && s.by_config[0].score < 1.0) {
    fmt::print(stderr, "kvd-longbench: FAILED: dense did not answer ({}): '{}', expected {}\n", where(), s.by_config[0].text,
               fmt::join(s.answers, ", "));
    ++failures;
  }
  return failures;
}

/// A cell's figures: the samples of one (task, haystack, context) under one configuration.
struct Cell {
  Interval accuracy;
  double agreement = 0;    ///< samples whose score equals dense's
  double same_tokens = 0;  ///< samples whose reply is dense's, token for token
  double ms_per_token = 0;
  double pages_per_step = 0;
};

Cell cell_of(const std::vector<const Sample*>& samples, std::size_t config) {
  Cell c;
  std::vector<double> scores;
  for (const Sample* s : samples) {
    const Answer& a = s->by_config[config];
    scores.push_back(a.score);
    c.agreement += a.score == s->by_config[0].score;
    c.same_tokens += a.same_tokens;
    c.ms_per_token += a.ms_per_token;
    c.pages_per_step += a.pages_per_step;
  }
  const double n = static_cast<double>(std::max<std::size_t>(1, samples.size()));
  c.accuracy = interval95(scores);
  c.agreement /= n, c.same_tokens /= n, c.ms_per_token /= n, c.pages_per_step /= n;
  return c;
}

std::string cell_text(const Interval& i) { return fmt::format("{:.2f} [{:.2f},{:.2f}]", i.mean, i.low, i.high); }

using Key = std::tuple<int, int, std::int64_t>;  // task, haystack, context

std::map<Key, std::vector<const Sample*>> by_cell(const std::vector<Sample>& samples) {
  std::map<Key, std::vector<const Sample*>> m;
  for (const auto& s : samples) m[{static_cast<int>(s.spec.kind), static_cast<int>(s.spec.haystack), s.spec.context}].push_back(&s);
  return m;
}

/// Per (haystack, context): a row per configuration, accuracy per task with its interval, then
/// the pooled accuracy, agreement with dense and decode time.
void print_tables(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs, const std::vector<TaskKind>& tasks) {
  const auto cells = by_cell(samples);
  std::map<std::pair<int, std::int64_t>, std::vector<const Sample*>> blocks;
  for (const auto& s : samples) blocks[{static_cast<int>(s.spec.haystack), s.spec.context}].push_back(&s);
  for (const auto& [hc, all] : blocks) {
    fmt::print("\n{} haystack, {} tokens: accuracy [95% interval] per task ({} samples per task)\n", haystack_name(static_cast<Haystack>(hc.first)),
               hc.second, all.size() / tasks.size());
    fmt::print("{:<26}", "configuration");
    for (TaskKind t : tasks) fmt::print(" {:>18}", task_name(t));
    fmt::print(" {:>18} {:>7} {:>7} {:>8} {:>8}\n", "pooled", "agree", "tokens", "ms/tok", "pages");
    for (std::size_t c = 0; c < configs.size(); ++c) {
      fmt::print("{:<26}", configs[c].name());
      for (TaskKind t : tasks) {
        const auto it = cells.find({static_cast<int>(t), hc.first, hc.second});
        fmt::print(" {:>18}", it == cells.end() ? "-" : cell_text(cell_of(it->second, c).accuracy));
      }
      const Cell p = cell_of(all, c);
      fmt::print(" {:>18} {:>7.2f} {:>7.2f} {:>8.1f} {:>8.2f}\n", cell_text(p.accuracy), p.agreement, p.same_tokens, p.ms_per_token,
                 p.pages_per_step);
    }
  }
}

/// Pooled over the cells where dense scores above 0.5 (the tasks the model can do at that
/// length): each configuration's accuracy, its difference from dense, and agreement.
nlohmann::json pooled_where_dense_works(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  std::vector<const Sample*> kept;
  std::size_t cells_kept = 0;
  for (const auto& [key, ss] : by_cell(samples))
    if (cell_of(ss, 0).accuracy.mean > 0.5) kept.insert(kept.end(), ss.begin(), ss.end()), ++cells_kept;
  fmt::print("\npooled over the {} cells where dense scores above 0.5 ({} samples); '- dense' is the paired difference "
             "with its 95% interval:\n", cells_kept, kept.size());
  fmt::print("{:<26} {:>18} {:>24} {:>7}\n", "configuration", "accuracy", "- dense [95%]", "agree");
  nlohmann::json out = nlohmann::json::array();
  const auto scores = [&](std::size_t c) {
    std::vector<double> v;
    for (const Sample* s : kept) v.push_back(s->by_config[c].score);
    return v;
  };
  const std::vector<double> dense = scores(0);
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const Cell p = cell_of(kept, c);
    const Interval d = paired_difference95(scores(c), dense);
    fmt::print("{:<26} {:>18} {:>24} {:>7.3f}\n", configs[c].name(), cell_text(p.accuracy),
               fmt::format("{:+.3f} [{:+.3f},{:+.3f}]", d.mean, d.low, d.high), p.agreement);
    out.push_back({{"config", configs[c].name()}, {"accuracy", p.accuracy.mean}, {"low", p.accuracy.low}, {"high", p.accuracy.high},
                   {"n", p.accuracy.n}, {"agreement", p.agreement}, {"minus_dense", d.mean}, {"minus_dense_low", d.low},
                   {"minus_dense_high", d.high}});
  }
  return out;
}

/// Per haystack: accuracy pooled over the tasks, per context and depth band of the needle (where
/// the needle, or vt's first statement, stands in the document), with N per band.
nlohmann::json print_depth_bands(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  using BandKey = std::tuple<int, std::int64_t, int>;  // haystack, context, band
  std::map<BandKey, std::vector<const Sample*>> bands;
  for (const auto& s : samples) bands[{static_cast<int>(s.spec.haystack), s.spec.context, depth_band(s.spec.depth)}].push_back(&s);
  nlohmann::json out = nlohmann::json::array();
  std::map<int, std::vector<BandKey>> by_haystack;
  for (const auto& [key, ss] : bands) by_haystack[std::get<0>(key)].push_back(key);
  for (const auto& [h, keys] : by_haystack) {
    fmt::print("\n{} haystack: accuracy pooled over the tasks, per context and needle depth band (N)\n", haystack_name(static_cast<Haystack>(h)));
    fmt::print("{:<26}", "configuration");
    for (const auto& k : keys)
      fmt::print(" {:>16}", fmt::format("{} {} ({})", std::get<1>(k), depth_band_name(std::get<2>(k)), bands[k].size()));
    fmt::print("\n");
    for (std::size_t c = 0; c < configs.size(); ++c) {
      fmt::print("{:<26}", configs[c].name());
      for (const auto& k : keys) {
        const Cell x = cell_of(bands[k], c);
        fmt::print(" {:>16.3f}", x.accuracy.mean);
        out.push_back({{"haystack", haystack_name(static_cast<Haystack>(h))}, {"context", std::get<1>(k)},
                       {"band", depth_band_name(std::get<2>(k))}, {"config", configs[c].name()}, {"accuracy", x.accuracy.mean},
                       {"low", x.accuracy.low}, {"high", x.accuracy.high}, {"n", x.accuracy.n}, {"agreement", x.agreement}});
      }
      fmt::print("\n");
    }
  }
  return out;
}

nlohmann::json samples_json(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : samples) {
    nlohmann::json j = {{"task", task_name(s.spec.kind)}, {"haystack", haystack_name(s.spec.haystack)}, {"context", s.spec.context},
                        {"depth", s.spec.depth}, {"seed", s.spec.seed}, {"prompt_tokens", s.prompt_tokens},
                        {"document_tokens", s.document_tokens}, {"prefill_ms", s.prefill_ms}, {"answers", s.answers}};
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Answer& a = s.by_config[c];
      j["configs"][configs[c].name()] = {{"reply", a.text}, {"ids", a.ids}, {"score", a.score}, {"same_tokens", a.same_tokens},
                                         {"same_bits", a.same_bits}, {"ms_per_token", a.ms_per_token},
                                         {"pages_per_step", a.pages_per_step}};
    }
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json cells_json(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, ss] : by_cell(samples))
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Cell x = cell_of(ss, c);
      out.push_back({{"task", task_name(static_cast<TaskKind>(std::get<0>(key)))}, {"haystack", haystack_name(static_cast<Haystack>(std::get<1>(key)))},
                     {"context", std::get<2>(key)}, {"config", configs[c].name()}, {"accuracy", x.accuracy.mean},
                     {"low", x.accuracy.low}, {"high", x.accuracy.high}, {"n", x.accuracy.n}, {"agreement", x.agreement},
                     {"same_tokens", x.same_tokens}, {"ms_per_token", x.ms_per_token},
                     {"pages_per_step", x.pages_per_step}});
    }
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
  const auto cells = run_fidelity(cx, pr.tok, plan, [&](std::size_t d, std::size_t t) { bar.update(static_cast<std::int64_t>(d), static_cast<std::int64_t>(t)); });
  fmt::print("\n{:<10} {:>8} {:<26} {:>10} {:>7} {:>9} {:>9} {:>8}\n", "document", "position", "configuration", "KL (nats)", "top-1",
             "ppl", "dense ppl", "ms/tok");
  for (const auto& c : cells) {
    fmt::print("{:<10} {:>8} {:<26} {:>10.5f} {:>7.3f} {:>9.3f} {:>9.3f} {:>8.1f}\n", c.doc, c.position, c.config, c.kl, c.top1, c.ppl,
               c.dense_ppl, c.ms_per_token);
    report["fidelity"].push_back({{"document", c.doc}, {"position", c.position}, {"config", c.config}, {"tokens", c.tokens}, {"kl", c.kl},
                                  {"top1", c.top1}, {"ppl", c.ppl}, {"dense_ppl", c.dense_ppl}, {"ms_per_token", c.ms_per_token}});
  }
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "a GGUF model with a chat template, or smollm2 (the cached SmolLM2-135M-Instruct; scripts/get-model)");
  app.add_option("--tasks", o.tasks, "all, or: niah-number niah-word multikey multivalue vt")->delimiter(',');
  app.add_option("--contexts", o.contexts, "context lengths in tokens (prompt with its chat template, plus the reply)")->delimiter(',');
  app.add_option("--haystacks", o.haystacks, "prose (the licence texts) and/or repeat (RULER's repeated sentences, a control)")->delimiter(',');
  app.add_option("--samples", o.samples, "samples per task, context and haystack (depths spread over 0-100%)")->check(CLI::Range(1, 100000));
  app.add_option("--budgets", o.budgets, "sparse budgets (fractions of the candidate pages) for --configs all")->delimiter(',');
  app.add_option("--configs", o.configs, "all (dense, every sparse index and tiered:hierarchical at each budget), or a list: dense first, "
                 "then INDEX@BUDGET or tiered:hierarchical@BUDGET; hierarchical{K=V;...} sets expand, min_scored, "
                 "score_all_below, pair_radii, pair_weight, radius_weight or pages_per_cluster")->delimiter(',');
  app.add_option("--seed", o.seed, "picks every sample's keys, values and haystack start");
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
  app.add_option("--json", o.json, "write every sample and cell as JSON to this file");
  app.add_option("--store-dir", o.store_dir, "tiered: the folder of the SSD store (default: the temporary directory)");
  app.add_option("--record-traces", o.record_traces, "a folder: record each sample's dense prefill and reply as a trace "
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
    if (o.fidelity) {
      // The last forced token sits at position P + forced - 1.
      const std::int64_t end = *std::max_element(o.positions.begin(), o.positions.end()) + o.forced;
      if (end > model.config.max_seq) {
        fmt::print("kvd-longbench: positions up to {} run beyond the model's trained context of {} tokens\n", end - 1, model.config.max_seq);
        model.config.max_seq = static_cast<int>(end);
      }
    }
    ReplayContext cx;
    cx.model = &model;
    cx.pool = &pool;
    cx.layout.threads = o.threads;
    cx.layout.ssd_path = ((o.store_dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(o.store_dir)) /
                          fmt::format("kvd-longbench-{}.store", ::getpid())).string();
    const Prompter pr(model);
    std::string command = "kvd-longbench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    nlohmann::json report = {{"command", command}, {"model", model.source}, {"kv_dtype", cx.layout.dtype}, {"page_tokens", cx.layout.page_tokens},
                             {"sink_tokens", cx.layout.sink_tokens}, {"local_tokens", cx.layout.local_tokens}, {"threads", pool.threads()}};
    fmt::print("kvd-longbench: {} ({} KV, {}-token pages, sink {}, local {}, {} threads)\n", model.source, cx.layout.dtype, cx.layout.page_tokens,
               cx.layout.sink_tokens, cx.layout.local_tokens, pool.threads());
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
