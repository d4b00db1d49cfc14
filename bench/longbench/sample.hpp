// kvd-longbench's unit of work: one sample (a task at one context, haystack and depth) prefilled
// once, densely, then replayed under every configuration of the run, each reply scored against
// the task's answers. The prompter turns a task into the model's chat-formatted token ids, and
// check_sample holds every sample to Decision 2 and the bit-for-bit oracle.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tokenizer/chat.hpp"
#include "kvdrive/eval/trace.hpp"
#include "replay.hpp"
#include "tasks.hpp"
#include "tokenizer/tokenizer.hpp"

namespace kvdrive::longbench {

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
inline std::filesystem::path trace_path(const std::string& dir, const TaskSpec& spec) {
  return std::filesystem::path(dir) / fmt::format("{}-{}-{}-{}.trace", task_name(spec.kind), haystack_name(spec.haystack), spec.context, spec.seed);
}

/// Every configuration on one sample. With a trace folder, the dense prefill and dense's reply are
/// recorded (eval::TraceWriter; scripts/analysis/page-summaries/misses.py reads them); the trace
/// is kept only where some configuration scored below dense.
inline Sample run_sample(const ReplayContext& cx, const Prompter& pr, const TaskSpec& spec, const std::vector<ConfigSpec>& configs,
                         const std::string& trace_dir = {}) {
  const Task task = make_task(
      spec, [&](const std::string& u, const std::string& r) { return static_cast<std::int64_t>(pr.ids(u, r).size()); },
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
    llama::Decoder<decltype(kv)> dec(*cx.model, kv, *cx.pool, cx.layout.attention.prefill_chunk);
    std::optional<eval::TraceWriter> trace;
    if (!trace_dir.empty()) {
      trace.emplace(trace_path(trace_dir, spec).string(), cfg.shape, cfg.dtype);
      dec.record(&*trace);
    }
    dec.warm_up_after_prefill(cx.layout.tiers.warm_up);  // the queries tiered placement ranks pages by
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
  if (!trace_dir.empty() && std::none_of(s.by_config.begin(), s.by_config.end(), [&](const Answer& a) { return a.score < s.by_config[0].score; }))
    std::filesystem::remove(trace_path(trace_dir, spec));
  return s;
}

/// Decision 2 and the bit-for-bit oracle, checked on every sample: tiered Hierarchical gives
/// sparse Hierarchical's tokens, OracleMass at budget 1 gives dense's logits; with
/// --require-dense-correct, dense answers every sample. Returns the failures, each said on stderr.
inline int check_sample(const Sample& s, const std::vector<ConfigSpec>& configs, bool require_dense) {
  int failures = 0;
  const auto where = [&] {
    return fmt::format("{} {} {} tokens seed {}", task_name(s.spec.kind), haystack_name(s.spec.haystack), s.spec.context, s.spec.seed);
  };
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

}  // namespace kvdrive::longbench
