// kvd-llama's run: everything between parsing the options (main.cpp) and the exit code. It
// builds the prompt, the tiers and the KvManager, prefills, decodes and prints the summary.
// main.cpp runs it on the CPU; run_cuda.cu instantiates it with cuda::DeviceTier, backend::Cuda
// and CublasLinear for --device cuda.
//   run_options.hpp  the options (RunOptions, by group)
//   run_prompt.hpp   the prompt's text and ids
//   run_manager.hpp  the KvManager's configuration, index and tiers
//   run_share.hpp    prefix sharing through --remote or --prefix-store
//   run_decode.hpp   the decoding loop
//   run_summary.hpp  the header before prefill and the summary after decoding
//   run_batch.hpp    --batch N: N sequences decoded together
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "decoder/decoder.hpp"
#include "kvdrive/eval/trace.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kernels/linear.hpp"
#include "model/model.hpp"
#include "app/run_batch.hpp"
#include "app/run_decode.hpp"
#include "app/run_manager.hpp"
#include "app/run_options.hpp"
#include "app/run_prompt.hpp"
#include "app/run_share.hpp"
#include "app/run_summary.hpp"
#include "app/summary.hpp"

namespace kvdrive::llama {

/// One kvd-llama run: the prompt, prefill, `steps` decoded tokens and the summary, with the
/// attention of a KvManager<Index, Lookahead, TierList, Pipeline, Backend, Remote> and the
/// projections of Linear (CpuLinear, or CublasLinear with backend::Cuda). With a Remote tier
/// type (tier::RedisTier) and --remote, the prompt's prefix is shared through it.
template <class Index, class TierList = Tiers<tier::HostTier>, class Pipeline = pipeline::Serial, class Backend = backend::Cpu,
          class Linear = CpuLinear, class Remote = tier::NoRemote>
int run(const RunOptions& o, const Model& model, ThreadPool& pool, Backend backend) {
  if (o.prompt.batch > 1) return run_batch<Index, TierList, Pipeline, Backend, Linear>(o, model, pool, std::move(backend));
  // Load: the prompt, the tiers, the manager and the decoder.
  const Config cfg = manager_config(o, model.config);
  const std::optional<Tokenizer> tokenizer = make_tokenizer(o.model, model);
  const PromptInput in = prompt_input(o, model, tokenizer);
  constexpr bool tiered = TierList::kCount > 1;
  TierPlan plan;
  if constexpr (tiered) plan = plan_tiers(o, cfg, static_cast<std::int64_t>(in.ids.size()) + o.sampling.steps);
  using Manager = KvManager<Index, eviction::Lookahead, TierList, Pipeline, Backend, Remote>;
  PrefixShare<Remote>::check(o.sharing, o.model.device);
  PrefixShare<Remote> share;  // outlives kv
  Manager kv(cfg, index_for<Index>(model.config, rescore_pool_of(o.attention)), eviction::Lookahead{plan.window}, make_tiers<TierList>(o.tiers, plan),
             {}, std::move(backend));
  share.connect(o.sharing, model, kv, in.ids);
  Decoder<Manager, Linear> decoder(model, kv, pool, o.attention.prefill_chunk, std::span<const int>(share.shared));
  if constexpr (tiered) set_up_tiered<Index, Pipeline>(o.tiers, plan, kv, decoder);
  else if (cfg.pins.enabled()) decoder.warm_up_after_prefill(o.tiers.warm_up);  // ranks the pages to pin (KvManager::warm_up)
  std::optional<eval::TraceWriter> trace;
  if (!o.output.record_trace.empty()) {
    trace.emplace(o.output.record_trace, cfg.shape, cfg.dtype);
    decoder.record(&*trace);
  }
  if (!o.output.print_ids) print_run_header<Index, Linear>(o, model, cfg, in, pool.threads());

  // Prefill, then decode.
  Progress prefill_bar("prefill");
  const std::vector<float>& first = decoder.prefill(in.ids, [&](std::int64_t d, std::int64_t t) { prefill_bar.update(d, t); });
  const ReadMark prefill = read_mark<TierList>(kv);  // warm-up reads, kept apart from decoding's
  const Decoded out = decode(o.sampling, o.output.print_ids, tokenizer, in, decoder, &first);
  if (trace) trace->close();
  if (o.output.print_ids) print_ids_line(out.generated);

  // Summary: gathered once, written as JSON and printed as text.
  RunSummary summary = run_summary<Index, TierList, Pipeline, Linear>(o, model, pool.threads(), plan, kv, decoder, prefill, share);
  summary.reply = reply_summary(out, in.text, tokenizer.has_value());
  summary.ended_at_eos = out.ended;
  write_stats_json(o.output.stats_json, run_json(summary));
  if (!o.output.print_ids) print_run_summary(summary);
  return summary.reply.expected.empty() || summary.reply.correct ? 0 : kWrongAnswer;
}

}  // namespace kvdrive::llama
