// kvd-llama: the reference Llama decoder on kvdrive. Loads a GGUF file (SmolLM2 and other Llama
// models, quantized or not), a Hugging Face folder or a llama2.c checkpoint, or makes a synthetic
// model, prefills a prompt, decodes N tokens with every attention going through a
// kvdrive::KvManager (dense, or sparse with a chosen index), and closes with a summary. This file
// parses the options and picks the KvManager's policies; run.hpp does the run, on the CPU or,
// with --device cuda, through run_cuda.cu.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <string>
#include <vector>

#include "model/gguf_loader.hpp"
#include "model/hf_loader.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#ifdef KVD_LLAMA_REDIS
#include "kvdrive/tier/redis.hpp"
#endif
#include "model/llama2c.hpp"
#include "model/model_cache.hpp"
#include "app/run.hpp"
#include "app/run_cuda.hpp"
#include "model/synthetic.hpp"
#include "model/weights_f32.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;

// --prefix-store keeps the prompt's pages in a local folder across runs; --remote shares them
// through a Redis server (where hiredis is built in).
#ifdef KVD_LLAMA_REDIS
struct CpuRemote : tier::RemoteChoice<tier::PrefixStore, tier::RedisTier> {
  using Redis = tier::RedisTier;
};
#else
using CpuRemote = tier::RemoteChoice<tier::PrefixStore>;
#endif

/// A run on the CPU: backend::Cpu, CpuLinear, and the remote tier type when built in.
template <class Index, class TierList = Tiers<tier::HostTier>, class Pipeline = pipeline::Serial>
int run_cpu(const RunOptions& o, const Model& model, ThreadPool& pool) {
  return run<Index, TierList, Pipeline, backend::Cpu, CpuLinear, CpuRemote>(o, model, pool, backend::Cpu(pool));
}

/// The model: a file, the cached SmolLM2 or a synthetic one (with its shape), and a tokenizer.
void add_model_options(CLI::App& app, ModelOptions& model) {
  app.add_option("--model", model.path,
                 "GGUF file (its tokenizer and chat template included), smollm2 (the cached SmolLM2-135M-Instruct; "
                 "scripts/get-model), llama2.c checkpoint (.bin), Hugging Face folder (config.json + safetensors), or "
                 "synthetic:NAME[:seed=N] (tiny, small, smollm2-shape, llama3-8b, llama3-8b-layer)");
  app.add_option("--layers", model.shape.layers, "synthetic models: layers")->check(CLI::Range(1, 1024));
  app.add_option("--heads", model.shape.heads, "synthetic models: query heads")->check(CLI::Range(1, 1024));
  app.add_option("--kv-heads", model.shape.kv_heads, "synthetic models: KV heads")->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", model.shape.head_dim, "synthetic models: head dimension")->check(CLI::Range(2, 1024));
  app.add_option("--hidden", model.shape.hidden, "synthetic models: FFN width")->check(CLI::Range(1, 1 << 20));
  app.add_option("--vocab", model.shape.vocab, "synthetic models: vocabulary size")->check(CLI::Range(4, 1 << 24));
  app.add_option("--tokenizer", model.tokenizer, "llama2.c tokenizer.bin or Llama-3 tokenizer.model (tiktoken); a GGUF model brings its own");
}

/// The prompt's text: text, a file, a chat turn or a needle task, and the answer its reply must hold.
void add_prompt_text_options(CLI::App& app, PromptOptions& prompt) {
  app.add_option("--prompt", prompt.text, "prompt text (needs a tokenizer)");
  app.add_option("--prompt-file", prompt.file, "the prompt text from a file");
  app.add_flag("--chat", prompt.chat, "wrap the prompt in the model's chat template (GGUF models: ChatML, Llama-3 or Llama-2) as the user's turn");
  app.add_option("--system", prompt.system, "--chat: the system turn (default: the template's own, if it has one)");
  app.add_option("--reply-prefix", prompt.reply_prefix, "--chat: the first words of the assistant's reply, which the model continues");
  app.add_option("--needle", prompt.needle_tokens,
                 "a needle-in-a-haystack question (implies --chat): a document of N tokens of the licence "
                 "texts in /usr/share/common-licenses with one magic number inserted; the summary says whether the reply has it")
      ->check(CLI::Range(std::int64_t{64}, std::int64_t{1} << 24));
  app.add_option("--needle-depth", prompt.needle_depth, "--needle: where the number goes, as a fraction of the document")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--needle-seed", prompt.needle_seed, "--needle: picks the number");
  app.add_option("--question", prompt.question,
                 "--needle: ask this after the document instead of the magic-number question (the reply "
                 "is not checked; with --prefix-store, the document's pages stored by an earlier run are read back)");
  app.add_option("--expect", prompt.expect, "the reply must contain this text; the summary says whether it does (and --needle sets it)");
}

/// Whether generation ends at an end-of-generation token.
void add_ignore_eos_option(CLI::App& app, SamplingOptions& sampling) {
  app.add_flag("--ignore-eos", sampling.ignore_eos, "decode all --steps even past an end-of-generation token");
}

/// --batch, and a prompt of ids or a synthetic one.
void add_prompt_ids_options(CLI::App& app, PromptOptions& prompt) {
  app.add_option("--batch", prompt.batch,
                 "decode N sequences of different lengths together (one attend per layer for the batch): "
                 "N --needle documents (seeds, depths and lengths vary; each answer is checked) or N --prompt-len prompts")
      ->check(CLI::Range(1, 256));
  app.add_option("--prompt-ids", prompt.ids, "prompt as space-separated token ids");
  app.add_option("--prompt-len", prompt.length, "a seeded synthetic prompt of N tokens (BOS first), for long-context runs")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
}

/// How many tokens to generate, and how to sample them.
void add_sampling_options(CLI::App& app, SamplingOptions& sampling) {
  app.add_option("--steps", sampling.steps, "tokens to generate (at most: generation ends at an end-of-generation token)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--temperature", sampling.temperature, "sampling temperature; 0 is greedy")->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-p", sampling.top_p, "nucleus sampling mass in (0, 1]");
  app.add_option("--seed", sampling.seed, "sampling and synthetic-prompt seed");
}

/// The attention's mode.
void add_mode_option(CLI::App& app, AttentionOptions& attention) {
  app.add_option("--mode", attention.mode, "dense, sparse (KV in DRAM) or tiered (sparse, KV on fast DRAM + optional DRAM tier + SSD)")
      ->check(CLI::IsMember({"dense", "sparse", "tiered"}));
}

/// The tiers of tiered mode.
void add_tier_options(CLI::App& app, TierOptions& tiers) {
  app.add_option("--fast-bytes", tiers.fast_bytes, "tiered: fast-tier bytes (sink, local, staging, lookahead cache)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 50));
  app.add_option("--host-bytes", tiers.host_bytes, "tiered: a DRAM tier between the fast tier and the SSD (0: none)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 50));
  app.add_option("--warm-up", tiers.warm_up,
                 "tiered: after prefill, rank pages by the last N prompt queries' attention (SnapKV) and "
                 "place the best in the cache, the next in the host tier (0: no placement)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--pipeline", tiers.pipeline,
                 "tiered: serial (one stage after another) or elastic (select, classify and fetch "
                 "overlapped over micro-batches, tuned on the first step)")
      ->check(CLI::IsMember({"serial", "elastic"}));
  app.add_option("--tune", tiers.tune,
                 "tiered: on (grow the cache windows while the reads outlast selection over the first steps, and with "
                 "elastic choose the micro-batch size: neither changes what is selected, so tiered decodes sparse's tokens) or off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option_function<std::string>(
         "--tune-clusters", [&tiers](const std::string& v) { tiers.tune_clusters = v == "on"; },
         "tiered, hierarchical: on (choose the index's cluster size from the --warm-up queries, by mass recall and selection time, "
         "and re-index every layer: the index then differs from --mode sparse's, and so may the tokens) or off (the default)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option_function<std::string>(
         "--ssd-pack", [&tiers](const std::string& v) { tiers.ssd_pack = v == "on"; },
         "tiered: on (pages of up to half a 4 KiB block packed several to a block: fewer device bytes for pages read together) or off "
         "(a block per page, the layout before packing)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--ssd-path", tiers.ssd_path,
                 "tiered: the SSD store file (recreated each run, never over a file that is not a kvdrive store; PATH.log and PATH.lock beside it)");
}

/// The sparse index and what it selects.
void add_selection_options(CLI::App& app, AttentionOptions& attention) {
  app.add_option("--budget", attention.budget, "sparse budget: fraction of candidate pages, in (0, 1]");
  app.add_option("--carry-share", attention.carry.share,
                 "focus carry: the budget's share that pages the last step attended heavily may "
                 "take, in [0, 1); 0 turns it off")
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--carry-mass", attention.carry.mass,
                 "focus carry: a page that held this much of one head's attention at the last "
                 "step stays selected, in (0, 1]")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--index", attention.index,
                 "sparse index: hierarchical (KVDrive), quest, mean-key, centroid, simhash, product-quant, oracle, oracle-mass")
      ->check(CLI::IsMember({"hierarchical", "quest", "mean-key", "centroid", "simhash", "product-quant", "oracle", "oracle-mass", "dense"}));
  app.add_option("--pin-share", attention.pins.share,
                 "sparse and tiered: the budget's share that the pages the prompt's last --warm-up "
                 "queries attended most may take at every step (observation pins, SnapKV's window); 0 turns it off")
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--rescore-pool", attention.rescore_pool,
                 "sparse and tiered: a first look at every page's coded mean and radii proposes this many times the budget (and at "
                 "least half the candidates) and 4-bit copies of the pages' keys, scored token by token, keep the budget's best "
                 "(index::TokenRescore); 0 turns it off; default: 8 for hierarchical, 0 for the others")
      ->check(CLI::Range(0.0, 1e9));
}

/// Where the model is computed: the threads, the weights and the device.
void add_compute_options(CLI::App& app, ModelOptions& model) {
  app.add_option("--threads", model.threads, "CPU threads (0: all)");
  app.add_option("--weights", model.weights,
                 "blocks: compute from the GGUF blocks (activations quantized per block: int16 for the 32-value formats, int8 for the K-quants); "
                 "f32: decode every matrix to float first (exact, slower, more memory)")
      ->check(CLI::IsMember({"blocks", "f32"}));
  app.add_option("--device", model.device,
                 "cpu, or cuda: the KV cache in GPU memory (cuda::DeviceTier, attention by backend::Cuda) "
                 "and the projections in cuBLAS; modes dense, sparse and tiered (SSD behind), index hierarchical")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

/// What is written besides the reply.
void add_output_options(CLI::App& app, OutputOptions& output) {
  app.add_flag("--print-ids", output.print_ids, "print only the generated ids, space-separated, on one line of stdout");
  app.add_option("--stats-json", output.stats_json, "write the closing summary as JSON to this file");
  app.add_option("--record-trace", output.record_trace, "write Q, K (after RoPE) and V per layer and position to this file (docs/trace-format.md)");
}

/// The KV cache's dtype and pages, and the prefill's chunk.
void add_cache_options(CLI::App& app, AttentionOptions& attention) {
  app.add_option("--dtype", attention.dtype, "KV cache dtype")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--page-tokens", attention.page_tokens, "tokens per KV page")->check(CLI::Range(1, 4096));
  app.add_option("--cold-codec", attention.cold_codec,
                 "cold pages (past the sink and the local window) kept coded on the backing tiers and attended as decoded values")
      ->check(CLI::IsMember({"none", "int8", "int4"}));
  app.add_option("--sink-tokens", attention.sink_tokens, "always-attended first tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--local-tokens", attention.local_tokens, "always-attended last tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--prefill-chunk", attention.prefill_chunk, "prompt tokens per prefill chunk")->check(CLI::Range(1, 1 << 16));
}

/// Sharing the prompt's prefix: through a Redis server, or a local prefix store across runs.
void add_sharing_options(CLI::App& app, SharingOptions& sharing) {
  app.add_option("--remote", sharing.remote,
                 "share the prompt's prefix with other engines through a Redis server: "
                 "redis://[[user]:password@]host[:port][/db] or unix:///path; prefill reads the pages another engine published "
                 "instead of computing them, and publishes its own (docs/remote.md)");
  app.add_option("--remote-ttl", sharing.remote_ttl_ms, "--remote: milliseconds the published pages live (0: until the server evicts them)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--remote-secret-file", sharing.remote_secret_file,
                 "--remote: a file (mode 600) holding the secret every engine of the "
                 "deployment shares, at least 16 bytes: pages are stored with an HMAC-SHA-256 under it, in a key space it names, so "
                 "pages written by a client without it are never used");
  app.add_option("--prefix-store", sharing.prefix_store,
                 "keep the prompt's pages in this folder across runs (made if missing; one kvd-llama "
                 "at a time): prefill reads the longest stored run of the prompt's leading pages instead of computing it (the same "
                 "document asked again with a new question), and stores the rest (docs/remote.md)");
  app.add_option("--prefix-store-bytes", sharing.prefix_store_bytes,
                 "--prefix-store: bytes it keeps; least recently used pages go first (default 8 GiB)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 50));
  app.add_option("--shared-prefix", sharing.shared_prefix,
                 "--remote, --prefix-store: the first N prompt tokens are shared, page by page "
                 "(default: the whole prompt)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
}

/// All of kvd-llama's options, each group filled by its own functions. CLI11 lists the options
/// in --help in the order they are added: these calls keep the order they had before the options
/// were grouped.
void add_options(CLI::App& app, RunOptions& o) {
  add_model_options(app, o.model);
  add_prompt_text_options(app, o.prompt);
  add_ignore_eos_option(app, o.sampling);
  add_prompt_ids_options(app, o.prompt);
  add_sampling_options(app, o.sampling);
  add_mode_option(app, o.attention);
  add_tier_options(app, o.tiers);
  add_selection_options(app, o.attention);
  add_compute_options(app, o.model);
  add_output_options(app, o.output);
  add_cache_options(app, o.attention);
  add_sharing_options(app, o.sharing);
}

/// Options that apply only with another: 0, or 2 (kvd-llama's usage error) after saying why.
int check_option_pairs(const CLI::App& app, const RunOptions& o) {
  struct Pair {
    bool missing;                      // the option they apply with is not given
    std::vector<const char*> options;  // the options that need it
    const char* needs;
  };
  const Pair pairs[] = {
      {o.prompt.needle_tokens == 0, {"--needle-depth", "--needle-seed", "--question"}, "--needle"},
      {o.sharing.remote.empty(), {"--remote-ttl", "--remote-secret-file"}, "--remote"},
      {o.sharing.prefix_store.empty(), {"--prefix-store-bytes"}, "--prefix-store"},
      {o.sharing.remote.empty() && o.sharing.prefix_store.empty(), {"--shared-prefix"}, "--remote or --prefix-store"},
  };
  for (const Pair& p : pairs) {
    if (!p.missing) continue;
    for (const char* opt : p.options)
      if (app.count(opt) > 0) {
        fmt::print(stderr, "kvd-llama: {} applies with {}\n", opt, p.needs);
        return 2;
      }
  }
  return 0;
}

/// --model's model (its path becomes the cached file's for smollm2), with --weights f32 decoded
/// to float.
Model load_model(ModelOptions& o, ThreadPool& pool) {
  Model model;
  if (auto spec = parse_synthetic(o.path)) {
    model = make_synthetic(*spec, o.shape, pool);
  } else {
    KVD_EXPECT(!o.shape.layers && !o.shape.heads && !o.shape.kv_heads && !o.shape.head_dim && !o.shape.hidden && !o.shape.vocab,
               "--layers/--heads/--kv-heads/--head-dim/--hidden/--vocab apply to synthetic models only");
    if (o.path == "smollm2") o.path = smollm2_path();
    model = std::filesystem::is_directory(o.path) ? load_hf(o.path) : is_gguf(o.path) ? load_gguf(o.path) : load_llama2c(o.path);
  }
  if (o.weights == "f32") model = with_f32_weights(std::move(model));
  return model;
}

/// --mode tiered: the fast tier, an optional DRAM tier and the SSD, with Hierarchical or Quest.
int run_tiered(const RunOptions& o, const Model& model, ThreadPool& pool) {
  KVD_EXPECT(o.attention.index != "dense", "--mode tiered is sparse: choose a sparse --index");
  using Ssd = Tiers<tier::HostTier, tier::SsdTier>;
  using HostSsd = Tiers<tier::HostTier, tier::HostTier, tier::SsdTier>;
  const bool host = o.tiers.host_bytes > 0;
  KVD_EXPECT(o.attention.index == "hierarchical" || o.tiers.pipeline == "serial", "--pipeline elastic runs with --index hierarchical (KVDrive)");
  KVD_EXPECT(rescore_pool_of(o.attention) == 0 || o.attention.index == "hierarchical",
             "--mode tiered rescores the hierarchical index (--rescore-pool 0 for quest)");
  if (o.attention.index == "quest") return host ? run_cpu<index::Quest, HostSsd>(o, model, pool) : run_cpu<index::Quest, Ssd>(o, model, pool);
  KVD_EXPECT(o.attention.index == "hierarchical", "--mode tiered runs the hierarchical (KVDrive) and quest indices");
  if (rescore_pool_of(o.attention) > 0) {
    using Rescored = index::TokenRescore<index::Hierarchical>;
    if (o.tiers.pipeline == "elastic")
      return host ? run_cpu<Rescored, HostSsd, pipeline::Elastic>(o, model, pool) : run_cpu<Rescored, Ssd, pipeline::Elastic>(o, model, pool);
    return host ? run_cpu<Rescored, HostSsd>(o, model, pool) : run_cpu<Rescored, Ssd>(o, model, pool);
  }
  if (o.tiers.pipeline == "elastic")
    return host ? run_cpu<index::Hierarchical, HostSsd, pipeline::Elastic>(o, model, pool)
                : run_cpu<index::Hierarchical, Ssd, pipeline::Elastic>(o, model, pool);
  return host ? run_cpu<index::Hierarchical, HostSsd>(o, model, pool) : run_cpu<index::Hierarchical, Ssd>(o, model, pool);
}

/// --mode dense or sparse: the KV cache in DRAM, with --index's policy.
int run_in_dram(const RunOptions& o, const Model& model, ThreadPool& pool) {
  if (o.attention.mode == "dense" || o.attention.index == "dense") return run_cpu<index::Dense>(o, model, pool);
  if (rescore_pool_of(o.attention) > 0) {
    if (o.attention.index == "quest") return run_cpu<index::TokenRescore<index::Quest>>(o, model, pool);
    if (o.attention.index == "mean-key") return run_cpu<index::TokenRescore<index::MeanKey>>(o, model, pool);
    KVD_EXPECT(o.attention.index == "hierarchical", "--rescore-pool wraps hierarchical, quest or mean-key (--rescore-pool 0 for {})",
               o.attention.index);
    return run_cpu<index::TokenRescore<index::Hierarchical>>(o, model, pool);
  }
  if (o.attention.index == "oracle-mass") return run_cpu<index::OracleMass>(o, model, pool);
  if (o.attention.index == "quest") return run_cpu<index::Quest>(o, model, pool);
  if (o.attention.index == "mean-key") return run_cpu<index::MeanKey>(o, model, pool);
  if (o.attention.index == "hierarchical") return run_cpu<index::Hierarchical>(o, model, pool);
  if (o.attention.index == "centroid") return run_cpu<index::Centroid>(o, model, pool);
  if (o.attention.index == "simhash") return run_cpu<index::SimHash>(o, model, pool);
  if (o.attention.index == "product-quant") return run_cpu<index::ProductQuant>(o, model, pool);
  return run_cpu<index::Oracle>(o, model, pool);
}

int main(int argc, char** argv) {
  RunOptions o;
  CLI::App app{"kvd-llama: a Llama decoder whose attention runs through kvdrive::KvManager"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (const int rc = check_option_pairs(app, o); rc != 0) return rc;

  try {
    ThreadPool pool(o.model.threads);
    const Model model = load_model(o.model, pool);
    KVD_EXPECT(o.attention.mode == "tiered" || (app.count("--fast-bytes") + app.count("--host-bytes") + app.count("--ssd-path") +
                                                app.count("--ssd-pack") + (o.attention.pins.enabled() ? 0 : app.count("--warm-up")) +
                                                app.count("--pipeline") + app.count("--tune") + app.count("--tune-clusters")) == 0,
               "--fast-bytes, --host-bytes, --ssd-path, --ssd-pack, --warm-up (without --pin-share), --pipeline, --tune and --tune-clusters "
               "apply to --mode tiered");
    if (o.model.device == "cuda") return run_on_cuda(o, model, pool);
    return o.attention.mode == "tiered" ? run_tiered(o, model, pool) : run_in_dram(o, model, pool);
  } catch (const Error& e) {
    fmt::print(stderr, "kvd-llama: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // out of memory, mostly
    fmt::print(stderr, "kvd-llama: error: {}\n", e.what());
    return 1;
  }
}
