// kvd-llama --batch N: N sequences of different lengths in one KvManager, each prefilled on its
// own, then decoded together by a BatchDecoder (one attend per layer for the batch, projections
// as matrix products over it). The prompts are --needle documents (N seeds, depths and lengths:
// each sequence's answer is checked) or seeded --prompt-len prompts, the i-th 1 - i / (2N) of
// the given length. Greedy; the summary gives the batch's decode throughput. Not applied under
// --batch: --tune (window growth, micro-batch), --tune-clusters, the placement share per sequence
// (warm-up fills a --host-bytes tier in sequence order).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decoder/decoder.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kernels/linear.hpp"
#include "model/model.hpp"
#include "app/run_manager.hpp"
#include "app/run_options.hpp"
#include "app/run_prompt.hpp"
#include "app/run_summary.hpp"
#include "app/summary.hpp"

namespace kvdrive::llama {

/// The options of each sequence of a --batch run.
inline std::vector<RunOptions> batch_members(const RunOptions& o) {
  KVD_EXPECT(o.prompt.batch >= 1, "--batch {}: expected at least 1", o.prompt.batch);
  KVD_EXPECT(o.prompt.needle_tokens > 0 || o.prompt.length > 0, "--batch needs --needle or --prompt-len (prompts of different lengths)");
  KVD_EXPECT(o.sharing.remote.empty() && o.output.record_trace.empty() && !o.output.print_ids,
             "--batch runs without --remote, --record-trace and --print-ids");
  KVD_EXPECT(o.prompt.expect.empty() || o.prompt.needle_tokens == 0, "--expect: each --batch needle document has its own number, checked already");
  KVD_EXPECT(o.model.device == "cpu", "--batch runs on the CPU (--device cpu)");
  std::vector<RunOptions> out;
  for (int i = 0; i < o.prompt.batch; ++i) {
    RunOptions p = o;
    const double shrink = 1.0 - static_cast<double>(i) / (2.0 * o.prompt.batch);
    if (o.prompt.needle_tokens > 0) {
      p.prompt.needle_tokens = std::max<std::int64_t>(64, static_cast<std::int64_t>(static_cast<double>(o.prompt.needle_tokens) * shrink));
      p.prompt.needle_seed = o.prompt.needle_seed + static_cast<std::uint64_t>(i);
      p.prompt.needle_depth = i == 0 ? o.prompt.needle_depth : std::fmod(o.prompt.needle_depth + 0.37 * i, 1.0);
    } else {
      p.prompt.length = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(o.prompt.length) * shrink));
      p.sampling.seed = o.sampling.seed + static_cast<std::uint64_t>(i);
    }
    out.push_back(p);
  }
  return out;
}

/// The prompts of a --batch run: a text and ids per member (batch_members).
struct BatchInput {
  std::vector<PromptInput> prompts;
  std::int64_t longest = 0, total = 0;  ///< prompt tokens: the longest prompt's, all of them
};

inline BatchInput batch_input(const RunOptions& o, const Model& model, const std::optional<Tokenizer>& tokenizer) {
  BatchInput in;
  for (const RunOptions& p : batch_members(o)) {
    in.prompts.push_back(prompt_input(p, model, tokenizer));
    const auto tokens = static_cast<std::int64_t>(in.prompts.back().ids.size());
    in.longest = std::max(in.longest, tokens);
    in.total += tokens;
  }
  return in;
}

inline void print_batch_header(const RunOptions& o, const Model& model, const Config& cfg, const BatchInput& in, std::string_view index,
                               unsigned threads) {
  const auto shortest =
      std::min_element(in.prompts.begin(), in.prompts.end(), [](const auto& x, const auto& y) { return x.ids.size() < y.ids.size(); });
  fmt::print("kvd-llama: {} ({}, weights {}); batch of {} sequences, {} to {} prompt tokens\n", model.source, shape_text(model.config),
             weights_text(model), in.prompts.size(), shortest->ids.size(), in.longest);
  fmt::print("attention: {} ({}) on {}, {} KV, {}-token pages, {} threads\n", o.attention.mode, index, o.model.device, dtype_name(cfg.dtype),
             cfg.page_tokens, threads);
}

/// What greedy decoding of the batch gave: each sequence's ids, and the tokens decoded for
/// sequences not yet ended (which the throughput counts).
struct BatchDecoded {
  std::vector<std::vector<int>> generated;
  std::int64_t live_tokens = 0;
};

/// Up to --steps greedy tokens for every sequence from its prefill's logits `first` on; a
/// sequence ends at a token of `stops`, and keeps decoding its last token, ignored, until all
/// have ended.
template <class Batch>
BatchDecoded decode_batch(int steps, const std::vector<int>& stops, Batch& batch, const std::vector<std::vector<float>>& first) {
  const auto argmax = [](const std::vector<float>& l) { return static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()); };
  const std::size_t n = first.size();
  BatchDecoded out;
  out.generated.resize(n);
  std::vector<bool> ended(n, false);
  std::vector<int> next(n);
  for (std::size_t i = 0; i < n; ++i) next[i] = argmax(first[i]);
  for (int s = 0; s < steps; ++s) {
    bool all_ended = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (!ended[i] && std::find(stops.begin(), stops.end(), next[i]) != stops.end()) ended[i] = true;
      if (!ended[i]) out.generated[i].push_back(next[i]);
      all_ended = all_ended && ended[i];
    }
    if (all_ended || s + 1 == steps) break;
    for (std::size_t i = 0; i < n; ++i) out.live_tokens += !ended[i];
    const auto& rows = batch.step(next);
    for (std::size_t i = 0; i < n; ++i) next[i] = argmax(rows[i]);
  }
  return out;
}

/// Each sequence's reply: its ids decoded (with a tokenizer) and its answer checked.
inline std::vector<BatchSequence> batch_sequences(const BatchInput& in, const BatchDecoded& out, const std::optional<Tokenizer>& tokenizer) {
  std::vector<BatchSequence> seqs;
  for (std::size_t i = 0; i < in.prompts.size(); ++i) {
    const PromptInput& p = in.prompts[i];
    std::string reply;
    int prev = p.ids.back();
    if (tokenizer)
      for (int id : out.generated[i]) reply += tokenizer->decode(prev, id), prev = id;
    seqs.push_back({p.ids.size(), reply_summary({out.generated[i], reply, false}, p.text, tokenizer.has_value())});
  }
  return seqs;
}

template <class Index, class TierList, class Pipeline, class Backend, class Linear>
int run_batch(const RunOptions& o, const Model& model, ThreadPool& pool, Backend backend) {
  KVD_EXPECT(o.sampling.temperature == 0.0f && o.sampling.top_p == 1.0f, "--batch decodes greedily (--temperature 0, no --top-p)");
  // Load: the prompts, the tiers, the manager and the batch's decoder.
  const Config cfg = manager_config(o, model.config);
  const std::optional<Tokenizer> tokenizer = make_tokenizer(o.model, model);
  const BatchInput in = batch_input(o, model, tokenizer);
  constexpr bool tiered = TierList::kCount > 1;
  TierPlan plan;
  if constexpr (tiered) plan = plan_tiers(o, cfg, in.longest + o.sampling.steps, in.prompts.size());
  using Manager = KvManager<Index, eviction::Lookahead, TierList, Pipeline, Backend>;
  Manager kv(cfg, index_for<Index>(model.config, rescore_pool_of(o.attention)), eviction::Lookahead{plan.window}, make_tiers<TierList>(o.tiers, plan),
             {}, std::move(backend));
  BatchDecoder<Manager, Linear> batch(model, kv, pool, o.attention.prefill_chunk);
  print_batch_header(o, model, cfg, in, Index::name(), pool.threads());

  // Prefill, each sequence on its own; then decode them together.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> first;
  for (const PromptInput& p : in.prompts) {
    auto& d = batch.add();
    if constexpr (tiered) d.warm_up_after_prefill(o.tiers.warm_up);
    first.push_back(d.prefill(p.ids));
  }
  BatchSummary summary;
  summary.prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const ReadMark prefill = read_mark<TierList>(kv);
  const BatchDecoded out = decode_batch(o.sampling.steps, stop_tokens(o.sampling, tokenizer), batch, first);

  // Summary: gathered once, written as JSON and printed as text.
  summary.model = model.source;
  summary.mode = o.attention.mode;
  summary.index = std::string(Index::name());
  summary.prompt_tokens = in.total;
  summary.steps = batch.steps();
  summary.step_ms = batch.step_ms();
  summary.linear_ms = batch.linear_ms();
  summary.live_tokens = out.live_tokens;
  summary.sequences = batch_sequences(in, out, tokenizer);
  summary.stats = kv.total_stats();
  if constexpr (tiered)
    summary.reads = tier_reads<TierList>(kv, prefill, std::max(1.0, static_cast<double>(summary.steps) * static_cast<double>(in.prompts.size())));
  print_batch_sequences(summary);
  write_stats_json(o.output.stats_json, batch_json(summary));
  print_batch_summary(summary);
  const AnswerCount answers = count_answers(summary);
  return answers.correct == answers.checked ? 0 : kWrongAnswer;
}

}  // namespace kvdrive::llama
