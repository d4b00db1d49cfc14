// kvd-llama's closing summary: what a run (run.hpp) or a --batch run (run_batch.hpp) measured,
// gathered once into a RunSummary or a BatchSummary, then printed twice from it: as JSON
// (--stats-json) and as text on stdout. Nothing here reads a manager or a decoder; run.hpp and
// run_batch.hpp fill the structs.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "decoder/decoder.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/index/cluster_size.hpp"
#include "model/model.hpp"

namespace kvdrive::llama {

/// --tune on: cache windows may grow to this W (or the planned W, if larger) over the first steps.
constexpr int kGrowWindowTo = 8, kGrowSteps = 16;

/// tokens per second over `ms` milliseconds (0 when no time passed).
inline double per_s(std::int64_t tokens, double ms) { return ms > 0 ? 1000.0 * static_cast<double>(tokens) / ms : 0.0; }

/// "30 layers, dim 576, 9/3 heads, head_dim 64": the model's shape, for the first line of a run.
inline std::string shape_text(const LlamaConfig& c) {
  return fmt::format("{} layers, dim {}, {}/{} heads, head_dim {}", c.layers, c.dim, c.heads, c.kv_heads, c.head_dim());
}

/// The model's weight types ("F32" for a model without any in blocks).
inline std::string weights_text(const Model& m) { return m.weight_types.empty() ? "F32" : m.weight_types; }

/// A sequence's reply: the generated ids, the text (with a tokenizer) and the answer's check.
struct ReplySummary {
  std::vector<int> generated;
  std::optional<std::string> text;  ///< the reply prefix and the decoded ids (with a tokenizer)
  std::string expected;             ///< what the reply must contain (empty: nothing checked)
  bool correct = false;             ///< the decoded ids hold `expected` (reply_has)
};

/// Bytes a slower tier served per decoded token (its misses, every layer): the pages' bytes as
/// stored (coded with --cold-codec), and for the SSD the bytes read from the device (whole
/// blocks: several packed pages share one, a lone page takes one).
struct TierReads {
  std::string tier;  ///< host or ssd
  double kib = 0;
  std::optional<double> device_kib;    ///< the SSD's
  std::optional<double> device_reads;  ///< the SSD's reads (I/Os, adjacent blocks merged)
};

inline nlohmann::json reads_json(const std::vector<TierReads>& reads) {
  nlohmann::json j = nlohmann::json::object();
  for (const TierReads& r : reads) {
    j[r.tier] = {{"kib_per_token", r.kib}};
    if (r.device_kib) j[r.tier]["device_kib_per_token"] = *r.device_kib;
    if (r.device_reads) j[r.tier]["device_reads_per_token"] = *r.device_reads;
  }
  return j;
}

/// The tiered run's autotuning: the cluster size, the cache windows and the micro-batch.
struct TuningSummary {
  bool enabled = false;  ///< --tune on
  index::ClusterSizeChoice clusters;
  std::vector<int> windows;     ///< W of every (layer, KV head), layer by layer
  int grown = 0;                ///< times a layer's windows grew (counted with --tune on)
  int planned_window = 0;       ///< W before growing (TierPlan)
  std::size_t micro_batch = 0;  ///< what the pipeline's tuning chose (0: none)
};

/// A pipeline that overlaps its stages (not Serial): its micro-batch size.
struct PipelineSummary {
  std::size_t micro_batch = 0;
  bool tuned = false;
};

/// The tiered run's tiers and what placement after prefill did.
struct TierSummary {
  double fast_mib = 0;
  int window = 0;                  ///< the lookahead cache window W planned
  std::optional<double> host_mib;  ///< with a DRAM tier between the fast tier and the SSD
  std::size_t host_pages = 0;      ///< pages the DRAM tier holds
  std::string ssd_path, ssd_io;
  bool direct_io = false;
  std::size_t ssd_pages = 0;
  std::vector<TierReads> reads;  ///< per slower tier, per decoded token
  int warm_up = 0;               ///< --warm-up: observation queries (0: no placement)
};

/// --remote: the prompt's shared prefix through the remote tier.
struct RemoteSummary {
  std::string url;
  std::int64_t shared_prefix_tokens = 0;
  std::uint64_t page_hits = 0, page_missing = 0, page_corrupt = 0, errors = 0, pages_published = 0, publish_failed = 0;
};

/// A one-sequence run's summary.
struct RunSummary {
  std::string model, mode, device, linear, index, pipeline;
  double budget = 0;
  unsigned threads = 0;
  DecoderTimes times;
  Stats stats;  ///< the manager's totals
  std::size_t index_bytes = 0;
  std::optional<TuningSummary> tuning;        ///< tiered runs
  std::optional<PipelineSummary> overlapped;  ///< pipelines other than serial
  std::optional<TierSummary> tiers;           ///< tiered runs
  std::optional<RemoteSummary> remote;        ///< --remote
  ReplySummary reply;
  bool ended_at_eos = false;
};

/// One sequence of a --batch run.
struct BatchSequence {
  std::size_t prompt_tokens = 0;
  ReplySummary reply;
};

/// A --batch run's summary.
struct BatchSummary {
  std::string model, mode, index;
  std::int64_t prompt_tokens = 0;
  double prefill_ms = 0;
  std::int64_t steps = 0;  ///< batch steps
  double step_ms = 0, linear_ms = 0;
  std::int64_t live_tokens = 0;  ///< decoded tokens of sequences not yet ended
  std::vector<BatchSequence> sequences;
  Stats stats;
  std::optional<std::vector<TierReads>> reads;  ///< tiered runs
};

/// The reply's fields of a summary's JSON: generated, reply and answer.
inline void add_reply_json(nlohmann::json& j, const ReplySummary& r) {
  j["generated"] = r.generated;
  if (r.text) j["reply"] = *r.text;
  if (!r.expected.empty()) j["answer"] = {{"expected", r.expected}, {"correct", r.correct}};
}

/// --stats-json: the summary's JSON into `path` (nothing when it is empty).
inline void write_stats_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream f(path);
  KVD_EXPECT(f.good(), "--stats-json: cannot write {}", path);
  f << j.dump(2) << "\n";
}

/// "  bytes read per decoded token (misses, every layer): host 0.0 KiB, ssd 0.3 KiB".
inline void print_tier_reads(const std::vector<TierReads>& reads) {
  std::string per_tier;
  for (std::size_t i = 0; i < reads.size(); ++i)
    per_tier += fmt::format(
        "{}{} {:.1f} KiB{}", i > 0 ? ", " : "", reads[i].tier, reads[i].kib,
        reads[i].device_kib ? fmt::format(" ({:.1f} KiB from the device in {:.0f} reads)", *reads[i].device_kib, reads[i].device_reads.value_or(0))
                            : std::string());
  fmt::print("  bytes read per decoded token (misses, every layer, as stored: coded with --cold-codec): {}\n", per_tier);
}

// --- a one-sequence run ---

inline nlohmann::json tuning_json(const TuningSummary& tu) {
  return {{"enabled", tu.enabled}, {"pages_per_cluster", tu.clusters.pages_per_cluster}, {"windows", tu.windows}, {"micro_batch", tu.micro_batch}};
}

inline nlohmann::json remote_json(const RemoteSummary& rs, const DecoderTimes& t) {
  return {{"url", rs.url},
          {"shared_prefix_tokens", rs.shared_prefix_tokens},
          {"loaded_tokens", t.prefix_loaded_tokens},
          {"load_ms", t.prefix_load_ms},
          {"page_hits", rs.page_hits},
          {"page_missing", rs.page_missing},
          {"page_corrupt", rs.page_corrupt},
          {"errors", rs.errors},
          {"pages_published", rs.pages_published},
          {"publish_failed", rs.publish_failed}};
}

inline nlohmann::json run_json(const RunSummary& r) {
  const DecoderTimes& t = r.times;
  const Stats& s = r.stats;
  nlohmann::json j;
  j["model"] = r.model;
  j["mode"] = r.mode;
  j["device"] = r.device;
  j["linear"] = r.linear;
  j["index"] = r.index;
  j["budget"] = r.budget;
  j["threads"] = r.threads;
  j["prompt_tokens"] = t.prefill_tokens;
  j["decode_tokens"] = t.decode_tokens;
  j["prefill_tokens_per_s"] = per_s(t.prefill_tokens, t.prefill_ms);
  j["decode_tokens_per_s"] = per_s(t.decode_tokens, t.decode_ms);
  j["time_ms"] = {{"prefill", t.prefill_ms},
                  {"prefill_attention", t.prefill_attention_ms},
                  {"warm_up", t.warm_up_ms},
                  {"decode", t.decode_ms},
                  {"linear", t.linear_ms},
                  {"select", s.time.select_ms},
                  {"classify", s.time.classify_ms},
                  {"fetch", s.time.fetch_ms},
                  {"compute", s.time.compute_ms},
                  {"commit", s.time.commit_ms},
                  {"classify_wait", s.time.classify_wait_ms},
                  {"fetch_wait", s.time.fetch_wait_ms},
                  {"overlap", s.time.overlap_ms},
                  {"attention_wall", s.time.wall_ms}};
  j["pipeline"] = r.pipeline;
  if (r.tuning) j["tuning"] = tuning_json(*r.tuning);
  j["attention"] = {{"steps", s.steps},
                    {"streams", s.streams},
                    {"candidate_pages", s.candidates},
                    {"selected_pages", s.selected},
                    {"attended_tokens", s.attended_tokens},
                    {"hits", s.hits},
                    {"misses", s.misses},
                    {"evictions", s.evictions},
                    {"warmed_pages", s.warmed},
                    {"placed_pages", s.placed},
                    {"hit_rate", s.hit_rate()},
                    {"index_bytes", r.index_bytes}};
  if (r.remote) j["remote"] = remote_json(*r.remote, t);
  if (r.tiers) j["tier_reads"] = reads_json(r.tiers->reads);
  add_reply_json(j, r.reply);
  j["ended_at_eos"] = r.ended_at_eos;
  return j;
}

/// The prefill, decode and per-layer attention lines.
inline void print_run_times(const RunSummary& r) {
  const DecoderTimes& t = r.times;
  const StageTimes& st = r.stats.time;
  const double steps = static_cast<double>(std::max<std::uint64_t>(1, r.stats.steps));
  fmt::print("  prefill: {} tokens in {:.1f} s = {:.1f} tokens/s (causal attention {:.1f} s)\n", t.prefill_tokens, t.prefill_ms / 1000,
             per_s(t.prefill_tokens, t.prefill_ms), t.prefill_attention_ms / 1000);
  fmt::print("  decode:  {} tokens in {:.2f} s = {:.2f} tokens/s\n", t.decode_tokens, t.decode_ms / 1000, per_s(t.decode_tokens, t.decode_ms));
  fmt::print(
      "  decode attention per layer step: select {:.3f} ms, classify {:.3f}, fetch {:.3f}, compute {:.3f}, commit {:.3f}; "
      "{:.3f} ms wall ({})\n",
      st.select_ms / steps, st.classify_ms / steps, st.fetch_ms / steps, st.compute_ms / steps, st.commit_ms / steps, st.wall_ms / steps, r.pipeline);
}

/// --tune on: how the cache windows grew, the micro-batch; with --tune-clusters on the cluster
/// size chosen.
inline void print_tuning(const TuningSummary& tu, bool overlapped) {
  std::string clusters = "not tuned (--tune-clusters off)";
  if (!tu.clusters.cases.empty()) {
    clusters = fmt::format("{} pages per cluster, of", tu.clusters.pages_per_cluster);
    for (const auto& c : tu.clusters.cases)
      clusters += fmt::format(" {} ({:.1f} us, recall {:.3f})", c.pages_per_cluster, c.select_us, c.mass_recall);
  }
  int w_min = 1 << 30, w_max = 0;
  for (int w : tu.windows) {
    w_min = std::min(w_min, w);
    w_max = std::max(w_max, w);
  }
  fmt::print("  tuning: cluster size {}; cache windows grew {} times over the first {} steps, W now {}..{} (from {}){}\n", clusters, tu.grown,
             kGrowSteps, w_min, w_max, tu.planned_window, overlapped ? fmt::format("; micro-batch {} streams", tu.micro_batch) : std::string());
}

inline void print_pipeline(const PipelineSummary& p, const Stats& s) {
  const double steps = static_cast<double>(std::max<std::uint64_t>(1, s.steps));
  fmt::print(
      "  pipeline: micro-batches of {} streams{}; select, classify and fetch overlap for {:.3f} ms per layer step; "
      "bubbles select {:.2f}, classify {:.2f}, fetch {:.2f}; classify waited {:.3f} ms, fetch {:.3f}\n",
      p.micro_batch, p.tuned ? " (tuned)" : "", s.time.overlap_ms / steps, s.time.select_bubble(), s.time.classify_bubble(), s.time.fetch_bubble(),
      s.time.classify_wait_ms / steps, s.time.fetch_wait_ms / steps);
}

inline void print_remote(const RemoteSummary& rs, const DecoderTimes& t) {
  fmt::print(
      "  prefix shared through {}: {} of the {}-token shared prefix read instead of computed ({:.1f} s); pages: {} read, {} missing, "
      "{} corrupt, {} errors; {} published ({} not)\n",
      rs.url, t.prefix_loaded_tokens, rs.shared_prefix_tokens, t.prefix_load_ms / 1000, rs.page_hits, rs.page_missing, rs.page_corrupt, rs.errors,
      rs.pages_published, rs.publish_failed);
}

/// The pages attended per stream and step, and the fast tier's cache.
inline void print_selection(const RunSummary& r) {
  const Stats& s = r.stats;
  if (s.streams > 0)
    fmt::print("  pages selected per stream and step: {:.1f} of {:.1f} candidates; tokens attended {:.0f}\n",
               static_cast<double>(s.selected) / static_cast<double>(s.streams), static_cast<double>(s.candidates) / static_cast<double>(s.streams),
               static_cast<double>(s.attended_tokens) / static_cast<double>(s.streams));
  fmt::print("  fast-tier cache: hit rate {:.1f}% ({} hits, {} misses, {} evictions); index {:.1f} MiB\n", 100 * s.hit_rate(), s.hits, s.misses,
             s.evictions, static_cast<double>(r.index_bytes) / (1 << 20));
}

/// Tiered runs: the tiers, the bytes the slower ones served, placement after prefill.
inline void print_tiers(const TierSummary& ts, const DecoderTimes& t, const Stats& s) {
  fmt::print("  tiers: fast {:.1f} MiB (lookahead W = {}), {}ssd {} ({}, {}, {} pages stored)\n", ts.fast_mib, ts.window,
             ts.host_mib ? fmt::format("host {:.1f} MiB ({} pages stored), ", *ts.host_mib, ts.host_pages) : std::string(), ts.ssd_path, ts.ssd_io,
             ts.direct_io ? "O_DIRECT" : "buffered", ts.ssd_pages);
  print_tier_reads(ts.reads);
  if (ts.warm_up > 0)
    fmt::print("  placement after prefill ({} observation queries, {:.1f} s): {} pages warmed into the cache{}\n", ts.warm_up, t.warm_up_ms / 1000,
               s.warmed, ts.host_mib ? fmt::format(", {} copied to host", s.placed) : std::string());
}

/// The text summary: the generated ids, then each measure on its line.
inline void print_run_summary(const RunSummary& r) {
  const std::vector<int>& generated = r.reply.generated;
  std::string ids;
  for (std::size_t i = 0; i < generated.size() && i < 32; ++i) ids += fmt::format("{} ", generated[i]);
  fmt::print("generated ids: {}{}\n", ids, generated.size() > 32 ? "..." : "");
  fmt::print("\n");
  fmt::print("summary\n");
  print_run_times(r);
  if (r.tuning && r.tuning->enabled) print_tuning(*r.tuning, r.overlapped.has_value());
  if (r.overlapped) print_pipeline(*r.overlapped, r.stats);
  fmt::print("  linear layers (prefill + decode): {:.2f} s\n", r.times.linear_ms / 1000);
  if (r.remote) print_remote(*r.remote, r.times);
  print_selection(r);
  if (r.tiers) print_tiers(*r.tiers, r.times, r.stats);
  if (!r.reply.expected.empty()) fmt::print("  answer: {} (expected {} in the reply)\n", r.reply.correct ? "correct" : "WRONG", r.reply.expected);
}

// --- a --batch run ---

inline nlohmann::json batch_json(const BatchSummary& b) {
  nlohmann::json j;
  j["model"] = b.model;
  j["mode"] = b.mode;
  j["index"] = b.index;
  j["batch"] = b.sequences.size();
  j["prompt_tokens"] = b.prompt_tokens;
  j["prefill_tokens_per_s"] = per_s(b.prompt_tokens, b.prefill_ms);
  j["batch_steps"] = b.steps;
  j["decode_tokens_per_s"] = per_s(b.live_tokens, b.step_ms);
  j["decode_tokens"] = b.live_tokens;
  j["decode_step_ms"] = b.steps > 0 ? b.step_ms / static_cast<double>(b.steps) : 0.0;
  nlohmann::json seqs = nlohmann::json::array();
  for (const BatchSequence& s : b.sequences) {
    nlohmann::json sj = {{"prompt_tokens", s.prompt_tokens}};
    add_reply_json(sj, s.reply);
    seqs.push_back(sj);
  }
  j["sequences"] = seqs;
  j["hit_rate"] = b.stats.hit_rate();
  if (b.reads) j["tier_reads"] = reads_json(*b.reads);
  return j;
}

/// A line per sequence: its reply (the first 100 characters, on one line) and its answer's check.
inline void print_batch_sequences(const BatchSummary& b) {
  for (std::size_t i = 0; i < b.sequences.size(); ++i) {
    const ReplySummary& r = b.sequences[i].reply;
    std::string verdict;
    if (!r.expected.empty()) verdict = fmt::format(" [{}: expected {}]", r.correct ? "correct" : "WRONG", r.expected);
    std::string shown = r.text.value_or("");
    std::replace(shown.begin(), shown.end(), '\n', ' ');
    if (shown.size() > 100) shown = shown.substr(0, 100) + "...";
    fmt::print("sequence {} ({} tokens): {}{}\n", i, b.sequences[i].prompt_tokens, r.text ? shown : fmt::format("{} ids", r.generated.size()),
               verdict);
  }
}

/// The answers checked and how many were right.
struct AnswerCount {
  int checked = 0, correct = 0;
};

inline AnswerCount count_answers(const BatchSummary& b) {
  AnswerCount a;
  for (const BatchSequence& s : b.sequences)
    if (!s.reply.expected.empty()) ++a.checked, a.correct += s.reply.correct;
  return a;
}

inline void print_batch_summary(const BatchSummary& b) {
  const std::size_t n = b.sequences.size();
  const Stats& st = b.stats;
  fmt::print("\nsummary\n");
  fmt::print("  prefill: {} tokens of {} sequences in {:.1f} s = {:.1f} tokens/s\n", b.prompt_tokens, n, b.prefill_ms / 1000,
             per_s(b.prompt_tokens, b.prefill_ms));
  fmt::print(
      "  decode:  {} batch steps of {} sequences ({} tokens of sequences not ended) in {:.2f} s = {:.2f} tokens/s ({:.1f} ms a step; "
      "projections {:.2f} s)\n",
      b.steps, n, b.live_tokens, b.step_ms / 1000, per_s(b.live_tokens, b.step_ms), b.steps > 0 ? b.step_ms / static_cast<double>(b.steps) : 0.0,
      b.linear_ms / 1000);
  fmt::print("  fast-tier cache: hit rate {:.1f}% ({} hits, {} misses)\n", 100 * st.hit_rate(), st.hits, st.misses);
  if (b.reads) print_tier_reads(*b.reads);
  const AnswerCount a = count_answers(b);
  if (a.checked > 0) fmt::print("  answers: {} of {} correct\n", a.correct, a.checked);
}

}  // namespace kvdrive::llama
