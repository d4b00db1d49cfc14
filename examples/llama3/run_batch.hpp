// kvd-llama --batch N: N sequences of different lengths in one KvManager, each prefilled on its
// own, then decoded together by a BatchDecoder (one attend per layer for the batch, projections
// as matrix products over it). The prompts are --needle documents (N seeds, depths and lengths:
// each sequence's answer is checked) or seeded --prompt-len prompts, the i-th 1 - i / (2N) of
// the given length. Greedy; the summary gives the batch's decode throughput. Not applied under
// --batch: --tune (cluster size, window growth, micro-batch), the placement share per sequence
// (warm-up fills a --host-bytes tier in sequence order).
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "decoder.hpp"
#include "run.hpp"

namespace kvdrive::llama {

/// The options of each sequence of a --batch run.
inline std::vector<RunOptions> batch_members(const RunOptions& o) {
  KVD_EXPECT(o.batch >= 1, "--batch {}: expected at least 1", o.batch);
  KVD_EXPECT(o.needle_tokens > 0 || o.prompt_len > 0, "--batch needs --needle or --prompt-len (prompts of different lengths)");
  KVD_EXPECT(o.remote.empty() && o.record_trace.empty() && !o.print_ids, "--batch runs without --remote, --record-trace and --print-ids");
  KVD_EXPECT(o.expect.empty() || o.needle_tokens == 0, "--expect: each --batch needle document has its own number, checked already");
  KVD_EXPECT(o.device == "cpu", "--batch runs on the CPU (--device cpu)");
  std::vector<RunOptions> out;
  for (int i = 0; i < o.batch; ++i) {
    RunOptions p = o;
    const double shrink = 1.0 - static_cast<double>(i) / (2.0 * o.batch);
    if (o.needle_tokens > 0) {
      p.needle_tokens = std::max<std::int64_t>(64, static_cast<std::int64_t>(static_cast<double>(o.needle_tokens) * shrink));
      p.needle_seed = o.needle_seed + static_cast<std::uint64_t>(i);
      p.needle_depth = i == 0 ? o.needle_depth : std::fmod(o.needle_depth + 0.37 * i, 1.0);
    } else {
      p.prompt_len = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(o.prompt_len) * shrink));
      p.seed = o.seed + static_cast<std::uint64_t>(i);
    }
    out.push_back(p);
  }
  return out;
}

template <class Index, class TierList, class Pipeline, class Backend, class Linear>
int run_batch(const RunOptions& o, const Model& model, ThreadPool& pool, Backend backend) {
  KVD_EXPECT(o.temperature == 0.0f && o.top_p == 1.0f, "--batch decodes greedily (--temperature 0, no --top-p)");
  const LlamaConfig& c = model.config;
  const Config cfg = manager_config(o, c);
  const std::optional<Tokenizer> tokenizer = make_tokenizer(o, model);
  const std::vector<RunOptions> members = batch_members(o);
  std::vector<PromptText> texts;
  std::vector<std::vector<int>> prompts;
  std::int64_t longest = 0, total = 0;
  for (const RunOptions& p : members) {
    texts.push_back(prompt_text(p, model, tokenizer ? &*tokenizer : nullptr));
    prompts.push_back(make_prompt(p, c, tokenizer, texts.back()));
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(prompts.back().size()));
    total += static_cast<std::int64_t>(prompts.back().size());
  }
  constexpr bool tiered = TierList::kCount > 1;
  TierPlan plan;
  if constexpr (tiered) plan = plan_tiers(o, cfg, longest + o.steps, members.size());
  using Manager = KvManager<Index, eviction::Lookahead, TierList, Pipeline, Backend>;
  Manager kv(cfg, {}, eviction::Lookahead{plan.window}, make_tiers<TierList>(o, plan), {}, std::move(backend));
  BatchDecoder<Manager, Linear> batch(model, kv, pool, o.prefill_chunk);
  fmt::print("kvd-llama: {} ({} layers, dim {}, {}/{} heads, head_dim {}, weights {}); batch of {} sequences, {} to {} prompt tokens\n",
             model.source, c.layers, c.dim, c.heads, c.kv_heads, c.head_dim(), model.weight_types.empty() ? "F32" : model.weight_types,
             members.size(), std::min_element(prompts.begin(), prompts.end(), [](const auto& x, const auto& y) { return x.size() < y.size(); })->size(),
             longest);
  fmt::print("attention: {} ({}) on {}, {} KV, {}-token pages, {} threads\n", o.mode, Index::name(), o.device, dtype_name(cfg.dtype),
             cfg.page_tokens, pool.threads());

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> first;
  for (std::size_t i = 0; i < members.size(); ++i) {
    auto& d = batch.add();
    if constexpr (tiered) d.warm_up_after_prefill(o.warm_up);
    first.push_back(d.prefill(prompts[i]));
  }
  const double prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto prefill_bytes_read = kv.total_stats().bytes_read;

  std::vector<int> stops;
  if (tokenizer && !o.ignore_eos) stops = tokenizer->stops();
  const auto argmax = [](const std::vector<float>& l) { return static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()); };
  std::vector<std::vector<int>> generated(members.size());
  std::vector<bool> ended(members.size(), false);
  std::vector<int> next(members.size());
  std::int64_t live_tokens = 0;  // tokens of sequences not yet ended, which the throughput counts
  for (std::size_t i = 0; i < members.size(); ++i) next[i] = argmax(first[i]);
  for (int s = 0; s < o.steps; ++s) {
    bool all_ended = true;
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (!ended[i] && std::find(stops.begin(), stops.end(), next[i]) != stops.end()) ended[i] = true;
      if (!ended[i]) generated[i].push_back(next[i]);
      all_ended = all_ended && ended[i];
    }
    if (all_ended || s + 1 == o.steps) break;
    for (std::size_t i = 0; i < members.size(); ++i) live_tokens += !ended[i];
    const auto& rows = batch.step(next);  // an ended sequence keeps decoding its last token, ignored
    for (std::size_t i = 0; i < members.size(); ++i) next[i] = argmax(rows[i]);
  }

  nlohmann::json j;
  j["model"] = model.source;
  j["mode"] = o.mode;
  j["index"] = std::string(Index::name());
  j["batch"] = members.size();
  j["prompt_tokens"] = total;
  j["prefill_tokens_per_s"] = prefill_ms > 0 ? 1000.0 * static_cast<double>(total) / prefill_ms : 0.0;
  const double steps = static_cast<double>(batch.steps());
  j["batch_steps"] = batch.steps();
  j["decode_tokens_per_s"] = batch.step_ms() > 0 ? 1000.0 * static_cast<double>(live_tokens) / batch.step_ms() : 0.0;
  j["decode_tokens"] = live_tokens;
  j["decode_step_ms"] = steps > 0 ? batch.step_ms() / steps : 0.0;
  int correct = 0, checked = 0;
  nlohmann::json seqs = nlohmann::json::array();
  for (std::size_t i = 0; i < members.size(); ++i) {
    std::string reply;
    int prev = prompts[i].back();
    if (tokenizer)
      for (int id : generated[i]) reply += tokenizer->decode(prev, id), prev = id;
    nlohmann::json sj = {{"prompt_tokens", prompts[i].size()}, {"generated", generated[i]}};
    if (tokenizer) sj["reply"] = texts[i].reply_prefix + reply;
    std::string verdict;
    if (!texts[i].expect.empty()) {
      const bool ok = reply_has(reply, texts[i].expect);
      correct += ok;
      ++checked;
      sj["answer"] = {{"expected", texts[i].expect}, {"correct", ok}};
      verdict = fmt::format(" [{}: expected {}]", ok ? "correct" : "WRONG", texts[i].expect);
    }
    seqs.push_back(sj);
    std::string shown = texts[i].reply_prefix + reply;
    std::replace(shown.begin(), shown.end(), '\n', ' ');
    if (shown.size() > 100) shown = shown.substr(0, 100) + "...";
    fmt::print("sequence {} ({} tokens): {}{}\n", i, prompts[i].size(), tokenizer ? shown : fmt::format("{} ids", generated[i].size()),
               verdict);
  }
  j["sequences"] = seqs;
  const Stats& st = kv.total_stats();
  j["hit_rate"] = st.hit_rate();
  if (!o.stats_json.empty()) {
    std::ofstream f(o.stats_json);
    KVD_EXPECT(f.good(), "--stats-json: cannot write {}", o.stats_json);
    f << j.dump(2) << "\n";
  }
  fmt::print("\nsummary\n");
  fmt::print("  prefill: {} tokens of {} sequences in {:.1f} s = {:.1f} tokens/s\n", total, members.size(), prefill_ms / 1000,
             j["prefill_tokens_per_s"].get<double>());
  fmt::print("  decode:  {} batch steps of {} sequences ({} tokens of sequences not ended) in {:.2f} s = {:.2f} tokens/s ({:.1f} ms a step; "
             "projections {:.2f} s)\n",
             batch.steps(), members.size(), live_tokens, batch.step_ms() / 1000, j["decode_tokens_per_s"].get<double>(), j["decode_step_ms"].get<double>(),
             batch.linear_ms() / 1000);
  fmt::print("  fast-tier cache: hit rate {:.1f}% ({} hits, {} misses)\n", 100 * st.hit_rate(), st.hits, st.misses);
  if constexpr (tiered) {
    std::string per_tier;
    for (std::size_t i = 1; i < TierList::kCount; ++i)
      per_tier += fmt::format("{}{} {:.1f} KiB", i > 1 ? ", " : "", i + 1 == TierList::kCount ? "ssd" : "host",
                              static_cast<double>(st.bytes_read[i] - prefill_bytes_read[i]) / std::max(1.0, steps * static_cast<double>(members.size())) / 1024);
    fmt::print("  bytes read per decoded token (misses, every layer): {}\n", per_tier);
  }
  if (checked > 0) fmt::print("  answers: {} of {} correct\n", correct, checked);
  return correct == checked ? 0 : kWrongAnswer;
}

}  // namespace kvdrive::llama
