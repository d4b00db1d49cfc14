// What a kvd-llama run reports: the lines before prefill, and after decoding the summary's
// structs (summary.hpp) filled from the manager, the decoder and the reply: bytes each slower
// tier served, the tuning, the tiers.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "model/model.hpp"
#include "app/run_decode.hpp"
#include "app/run_manager.hpp"
#include "app/run_options.hpp"
#include "app/run_prompt.hpp"
#include "app/summary.hpp"

namespace kvdrive::llama {

/// What the slower tiers had served at a point of the run (the end of prefill: its warm-up
/// reads are kept apart from decoding's): the manager's bytes per tier, as stored, and the SSD
/// tier's bytes read from the device.
struct ReadMark {
  std::array<std::uint64_t, kMaxTiers> bytes{};
  std::uint64_t ssd_device_bytes = 0, ssd_reads = 0;  ///< bytes read from the device, and the reads (merged runs of blocks)
};

template <class TierList, class Manager>
ReadMark read_mark(const Manager& kv) {
  ReadMark m;
  m.bytes = kv.total_stats().bytes_read;
  if constexpr (TierList::kCount > 1) {
    const auto& ssd = kv.tiers().template get<TierList::kCount - 1>();
    m.ssd_device_bytes = ssd.device_bytes_read();
    m.ssd_reads = ssd.read_ops();
  }
  return m;
}

/// Bytes each slower tier served per decoded token: what they served since `before`, over
/// `tokens` decoded tokens.
template <class TierList, class Manager>
std::vector<TierReads> tier_reads(const Manager& kv, const ReadMark& before, double tokens) {
  const ReadMark now = read_mark<TierList>(kv);
  const auto per_token = [&](std::uint64_t bytes) { return static_cast<double>(bytes) / tokens / 1024; };
  std::vector<TierReads> reads;
  for (std::size_t i = 1; i < TierList::kCount; ++i) {
    const bool ssd = i + 1 == TierList::kCount;
    reads.push_back({ssd ? "ssd" : "host", per_token(now.bytes[i] - before.bytes[i]), std::nullopt, std::nullopt});
    if (ssd) {
      reads.back().device_kib = per_token(now.ssd_device_bytes - before.ssd_device_bytes);
      reads.back().device_reads = static_cast<double>(now.ssd_reads - before.ssd_reads) / tokens;
    }
  }
  return reads;
}

/// The lines before prefill: the model, the task (if any), the attention and the prompt.
template <class Index, class Linear>
void print_run_header(const RunOptions& o, const Model& model, const Config& cfg, const PromptInput& in, unsigned threads) {
  const LlamaConfig& c = model.config;
  fmt::print("kvd-llama: {} ({}, vocab {}, {:.1f}M parameters, weights {})\n", model.source, shape_text(c), c.vocab,
             static_cast<double>(model.parameters()) / 1e6, weights_text(model));
  if (!in.text.what.empty()) fmt::print("{}\n", in.text.what);
  const std::string cold = cfg.cold_codec.coded()
                               ? fmt::format(", cold pages {} ({} of {} bytes)", cfg.cold_codec.name(), cfg.stored_page_bytes(), cfg.page_bytes())
                               : std::string();
  fmt::print("attention: {} ({}) on {}, {} KV, {}-token pages{}, sink {}, local {}, {} threads; projections: {}; prompt {} tokens, {} steps\n",
             o.attention.mode, Index::name(), o.model.device, dtype_name(cfg.dtype), cfg.page_tokens, cold, cfg.sink_tokens, cfg.local_tokens,
             threads, Linear::name(), in.ids.size(), o.sampling.steps);
}

inline ReplySummary reply_summary(const Decoded& out, const PromptText& text, bool tokenizer) {
  ReplySummary r;
  r.generated = out.generated;
  if (tokenizer) r.text = text.reply_prefix + out.reply;
  r.expected = text.expect;
  r.correct = !text.expect.empty() && reply_has(out.reply, text.expect);
  return r;
}

/// The tiered run's tuning: what was chosen, and the windows now.
template <class Manager, class Dec>
TuningSummary tuning_summary(const TierOptions& o, const TierPlan& plan, const Manager& kv, const Dec& decoder) {
  const auto& shape = kv.config().shape;
  TuningSummary tu;
  tu.enabled = o.tune == "on" || o.tune_clusters;
  tu.clusters = decoder.cluster_choice();
  for (int l = 0; l < shape.layers; ++l) {
    if (tu.enabled) tu.grown += kv.window_grown()[static_cast<std::size_t>(l)];  // kept only while windows grow (--tune on)
    for (int h = 0; h < shape.kv_heads; ++h) tu.windows.push_back(kv.window_of(l, h));
  }
  tu.planned_window = plan.window;
  tu.micro_batch = decoder.tuned_micro_batch();
  return tu;
}

/// The tiered run's tiers, and what the slower ones served per decoded token.
template <class TierList, class Manager>
TierSummary tier_summary(const TierOptions& o, const TierPlan& plan, Manager& kv, const ReadMark& prefill, std::int64_t decoded) {
  const Config& cfg = kv.config();
  const double mib = 1 << 20;
  const auto& ssd = kv.tiers().template get<TierList::kCount - 1>();
  TierSummary ts;
  ts.fast_mib = static_cast<double>(plan.fast_pages * cfg.page_bytes()) / mib;
  ts.window = plan.window;
  if constexpr (TierList::kCount == 3) {
    ts.host_mib = static_cast<double>(plan.host_pages * host_slot_bytes(cfg)) / mib;
    ts.host_pages = kv.tiers().template get<1>().stored_pages();
  }
  ts.ssd_path = o.ssd_path;
  ts.ssd_io = std::string(ssd.io_name());
  ts.direct_io = ssd.direct_io();
  ts.ssd_pages = ssd.stored_pages();
  ts.reads = tier_reads<TierList>(kv, prefill, static_cast<double>(std::max<std::int64_t>(1, decoded)));
  ts.warm_up = o.warm_up;
  return ts;
}

/// The summary of a run: the decoder's times, the manager's totals and the reply.
template <class Index, class TierList, class Pipeline, class Linear, class Manager, class Dec, class Share>
RunSummary run_summary(const RunOptions& o, const Model& model, unsigned threads, const TierPlan& plan, Manager& kv, const Dec& decoder,
                       const ReadMark& prefill, const Share& share) {
  RunSummary r;
  r.model = model.source;
  r.mode = o.attention.mode;
  r.device = o.model.device;
  r.linear = Linear::name();
  r.index = std::string(Index::name());
  r.pipeline = std::string(Pipeline::name());
  r.budget = o.attention.budget;
  r.threads = threads;
  r.times = decoder.times();
  r.stats = kv.total_stats();
  r.index_bytes = kv.index_bytes();
  if constexpr (TierList::kCount > 1) {
    r.tuning = tuning_summary(o.tiers, plan, kv, decoder);
    r.tiers = tier_summary<TierList>(o.tiers, plan, kv, prefill, r.times.decode_tokens);
  }
  if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>)
    r.overlapped = PipelineSummary{kv.pipeline_policy().micro_batch_for(static_cast<std::size_t>(kv.config().shape.kv_heads)), o.tiers.tune == "on"};
  r.remote = share.summary();
  return r;
}

}  // namespace kvdrive::llama
