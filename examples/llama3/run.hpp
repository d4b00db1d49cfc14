// kvd-llama's run: everything between parsing the options (main.cpp) and the exit code. It
// builds the prompt, the tiers and the KvManager, prefills, decodes and prints the summary.
// main.cpp runs it on the CPU; run_cuda.cu instantiates it with cuda::DeviceTier, backend::Cuda
// and CublasLinear for --device cuda.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#include "chat.hpp"
#include "decoder.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "linear.hpp"
#include "model.hpp"
#include "needle.hpp"
#include "sampler.hpp"
#include "synthetic.hpp"
#include "tokenizer.hpp"

namespace kvdrive::llama {

/// kvd-llama's options (main.cpp parses them).
struct RunOptions {
  std::string model = "synthetic:tiny";
  ShapeOverrides shape;
  std::string tokenizer;
  std::string prompt;
  std::string prompt_file;          ///< the prompt's text from a file
  std::string prompt_ids;
  bool chat = false;                ///< wrap the prompt in the model's chat template
  std::string system;               ///< --chat: the system turn (default: the template's own, if any)
  std::string reply_prefix;         ///< --chat: the first words of the reply, which the model continues
  std::int64_t needle_tokens = 0;   ///< a needle-in-a-haystack task of this many document tokens (needle.hpp)
  double needle_depth = 0.5;
  std::uint64_t needle_seed = 1;
  std::string expect;               ///< the reply must contain this text (the summary says whether it does)
  bool ignore_eos = false;          ///< run every --steps even past an end-of-generation token
  int batch = 1;                    ///< sequences decoded together (run_batch.hpp)
  std::int64_t prompt_len = 0;
  int steps = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint64_t seed = 1;
  std::string mode = "sparse";
  double budget = 0.0625;
  std::string index = "hierarchical";
  unsigned threads = 0;
  bool print_ids = false;
  std::string stats_json;
  std::string record_trace;
  std::string dtype = "f16";
  int page_tokens = 8, sink_tokens = 4, local_tokens = 64, prefill_chunk = 256;
  // tiered mode
  std::int64_t fast_bytes = 64ll << 20, host_bytes = 0;
  int warm_up = 32;  ///< tiered: observation queries for placement after prefill
  std::string pipeline = "serial";  ///< tiered: serial or elastic
  std::string tune = "on";          ///< tiered: tune cluster size, cache windows and micro-batch
  std::string ssd_path = "kvd-llama.store";
  std::string device = "cpu";       ///< cpu, or cuda (run_cuda.cu)
  // sharing the prompt's prefix through a remote tier (tier::RedisTier)
  std::string remote;               ///< redis://... or unix://...; empty: no sharing
  std::int64_t remote_ttl_ms = 0;   ///< expiry of the pages it stores (0: none)
  std::int64_t shared_prefix = -1;  ///< prompt tokens that form the shared prefix (-1: the whole prompt)
};

/// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)), enabled_(::isatty(2) != 0) {}
  void update(std::int64_t done, std::int64_t total) {
    if (!enabled_) return;
    const int width = 40, filled = total ? static_cast<int>(width * done / total) : width;
    fmt::print(stderr, "\r{:>8} [{}{}] {}/{}", label_, std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(width - filled), ' '), done, total);
    if (done == total) fmt::print(stderr, "\n");
  }

 private:
  std::string label_;
  bool enabled_;
};

inline std::vector<int> parse_ids(const std::string& s, int vocab) {
  std::vector<int> ids;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok) {
    std::size_t used = 0;
    long v = 0;
    try {
      v = std::stol(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVD_EXPECT(used == tok.size(), "--prompt-ids: '{}' is not an integer token id", tok);
    KVD_EXPECT(v >= 0 && v < vocab, "--prompt-ids: token id {} out of range [0, {})", v, vocab);
    ids.push_back(static_cast<int>(v));
  }
  return ids;
}

/// Tiered mode: fast-tier DRAM for sink, local, staging and the lookahead cache, then an
/// optional DRAM tier, then the SSD store. Sized for the run's longest context.
struct TierPlan {
  std::size_t fast_pages = 0, host_pages = 0;
  int window = 3;
};

inline TierPlan plan_tiers(const RunOptions& o, const Config& cfg, std::int64_t context, std::size_t sequences = 1) {
  const auto streams = static_cast<std::size_t>(cfg.shape.layers) * cfg.shape.kv_heads * sequences;
  const PageRanges r = page_ranges(context + 1, cfg.page_tokens, cfg.sink_tokens, cfg.local_tokens);
  const auto budget = static_cast<std::size_t>(cfg.budget.pages_for(r.candidates()));
  // Per stream: sink, local and tail, and a step's misses staged; plus one layer's prefill chunk.
  const std::size_t need = streams * (static_cast<std::size_t>(eviction::resident_pages(cfg, context)) + budget) +
                           static_cast<std::size_t>(cfg.shape.kv_heads) *
                               static_cast<std::size_t>((o.prefill_chunk + cfg.page_tokens - 1) / cfg.page_tokens + 1);
  TierPlan p;
  p.fast_pages = static_cast<std::size_t>(o.fast_bytes) / cfg.page_bytes();
  KVD_EXPECT(p.fast_pages >= need,
             "--fast-bytes {}: the fast tier needs at least {} bytes ({} pages of {} bytes: sink, local and staging for {} streams "
             "at {} tokens, and a prefill chunk)",
             o.fast_bytes, need * cfg.page_bytes(), need, cfg.page_bytes(), streams, context);
  p.window = budget ? static_cast<int>(std::min<std::size_t>(8, (p.fast_pages - need) / (streams * budget))) : 8;
  p.host_pages = static_cast<std::size_t>(o.host_bytes) / cfg.page_bytes();
  return p;
}

template <class TierList>
TierList make_tiers(const RunOptions& o, const TierPlan& p) {
  if constexpr (TierList::kCount == 1) {
    return TierList{};
  } else {
    tier::SsdTier::remove_files(o.ssd_path);  // a fresh store per run
    tier::SsdTier::Params sp;
    sp.path = o.ssd_path;
    using Fast = typename TierList::template Type<0>;  // HostTier, or cuda::DeviceTier
    Fast fast(typename Fast::Params{p.fast_pages});
    if constexpr (TierList::kCount == 2)
      return TierList(std::move(fast), tier::SsdTier(sp));
    else
      return TierList(std::move(fast), tier::HostTier(tier::HostTier::Params{p.host_pages}), tier::SsdTier(sp));
  }
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVD_EXPECT(f.good(), "{}: cannot open", path);
  std::ostringstream s;
  s << f.rdbuf();
  KVD_EXPECT(!f.bad(), "{}: cannot read", path);
  return s.str();
}

/// The prompt's text before tokenizing: --prompt, --prompt-file or a --needle task, in the chat
/// template with --chat (or --needle).
struct PromptText {
  std::string text;
  bool special = false;      ///< special-token strings in the text are tokens (the chat template's)
  std::string reply_prefix;  ///< printed before the generated text
  std::string expect;        ///< what the reply must contain (empty: nothing checked)
  std::string what;          ///< a line for the log (empty: nothing to say)
};

inline PromptText prompt_text(const RunOptions& o, const Model& m, const Tokenizer* tok) {
  KVD_EXPECT(o.prompt.empty() + o.prompt_file.empty() + (o.needle_tokens == 0) >= 2, "--prompt, --prompt-file and --needle exclude each other");
  PromptText p;
  p.expect = o.expect;
  p.reply_prefix = o.reply_prefix;
  bool chat = o.chat;
  if (!o.prompt_file.empty()) {
    p.text = read_text_file(o.prompt_file);
    KVD_EXPECT(!p.text.empty(), "--prompt-file {}: the file is empty", o.prompt_file);
  }
  else p.text = o.prompt;
  KVD_EXPECT(o.expect.empty() || tok != nullptr, "--expect checks the reply's text: it needs a tokenizer");
  if (o.needle_tokens > 0) {
    KVD_EXPECT(m.vocab != nullptr && !m.vocab->chat_template.empty(), "--needle asks its question in the model's chat template: {} has "
               "none (a GGUF model with tokenizer.chat_template)", m.source);
    KVD_EXPECT(tok != nullptr, "--needle needs a tokenizer (a GGUF model carries one)");
    const NeedleTask t = make_needle_task({o.needle_tokens, o.needle_depth, o.needle_seed},
                                          [&](const std::string& s) { return static_cast<std::int64_t>(tok->encode(s, false).size()); });
    p.text = t.prompt;
    if (p.reply_prefix.empty()) p.reply_prefix = t.reply_prefix;
    if (p.expect.empty()) p.expect = t.answer;
    chat = true;
    p.what = fmt::format("needle: a {}-token document from {} ({} files), the number {} after its first {} tokens (depth {:.2f})",
                         t.document_tokens, NeedleSpec{}.dir, t.sources.size(), t.answer, t.needle_token,
                         static_cast<double>(t.needle_token) / static_cast<double>(std::max<std::int64_t>(1, t.document_tokens)));
  }
  KVD_EXPECT(!chat || !p.text.empty(), "--chat needs a prompt (--prompt, --prompt-file or --needle)");
  KVD_EXPECT(chat || (o.system.empty() && o.reply_prefix.empty()), "--system and --reply-prefix apply with --chat");
  if (chat) {
    KVD_EXPECT(m.vocab != nullptr, "--chat needs the model's chat template: a GGUF model ({} has none)", m.source);
    const ChatTemplate ct = ChatTemplate::from_gguf(m.vocab->chat_template);
    std::vector<ChatTurn> turns;
    if (!o.system.empty()) turns.push_back({"system", o.system});
    turns.push_back({"user", p.text});
    p.text = ct.render(std::move(turns), p.reply_prefix);
    p.special = true;
  }
  return p;
}

/// Whether `reply` holds `expect` as a whole: a number not run into other digits ("123456" does
/// not answer "12345").
inline bool reply_has(const std::string& reply, const std::string& expect) {
  const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  for (std::size_t at = reply.find(expect); at != std::string::npos; at = reply.find(expect, at + 1)) {
    const bool before = at > 0 && digit(reply[at - 1]) && digit(expect.front());
    const bool after = at + expect.size() < reply.size() && digit(reply[at + expect.size()]) && digit(expect.back());
    if (!before && !after) return true;
  }
  return false;
}

/// The prompt's ids: text (with a tokenizer), ids, a seeded synthetic prompt, or BOS alone.
inline std::vector<int> make_prompt(const RunOptions& o, const LlamaConfig& c, const std::optional<Tokenizer>& tokenizer,
                                    const PromptText& text) {
  KVD_EXPECT(text.text.empty() || tokenizer, "a text prompt needs a tokenizer (--tokenizer, or a GGUF model), or give --prompt-ids");
  KVD_EXPECT(text.text.empty() || o.prompt_ids.empty(), "--prompt-ids excludes a text prompt");
  KVD_EXPECT(o.prompt_len == 0 || text.text.empty(), "--prompt-len pads an id prompt with random tokens; it excludes a text, chat or "
             "needle prompt");
  std::vector<int> prompt = tokenizer && !text.text.empty() ? tokenizer->encode(text.text, tokenizer->adds_bos(text.text), text.special)
                                                            : parse_ids(o.prompt_ids, c.vocab);
  if (o.prompt_len > 0) {
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<int> tok(std::min(3, c.vocab - 1), c.vocab - 1);
    if (prompt.empty()) prompt.push_back(tokenizer && tokenizer->bos() >= 0 ? tokenizer->bos() : 1);
    while (static_cast<std::int64_t>(prompt.size()) < o.prompt_len) prompt.push_back(tok(rng));
  }
  if (prompt.empty()) {  // BOS alone
    KVD_EXPECT(!tokenizer || tokenizer->bos() >= 0, "the prompt is empty and the tokenizer has no BOS token to start from: give a prompt");
    prompt.push_back(tokenizer ? tokenizer->bos() : 1);
  }
  return prompt;
}

/// kvd-llama's exit status when the reply lacks the --expect (or --needle) answer.
constexpr int kWrongAnswer = 3;

/// The KvManager's configuration for the run's options.
inline Config manager_config(const RunOptions& o, const LlamaConfig& c) {
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.page_tokens = o.page_tokens;
  cfg.sink_tokens = o.sink_tokens;
  cfg.local_tokens = o.local_tokens;
  cfg.dtype = o.dtype == "f32" ? DType::f32 : o.dtype == "bf16" ? DType::bf16 : DType::f16;
  cfg.budget = Budget::fraction(o.budget);
  return cfg;
}

/// --tokenizer's file, else the model's own (GGUF), else none.
inline std::optional<Tokenizer> make_tokenizer(const RunOptions& o, const Model& model) {
  std::optional<Tokenizer> t;
  if (!o.tokenizer.empty()) t.emplace(o.tokenizer, model.config.vocab);
  else if (model.vocab) t.emplace(*model.vocab);
  return t;
}

/// --tune on: cache windows may grow to this W (or the planned W, if larger) over the first steps.
constexpr int kGrowWindowTo = 8, kGrowSteps = 16;

/// One kvd-llama run: the prompt, prefill, `steps` decoded tokens and the summary, with the
/// attention of a KvManager<Index, Lookahead, TierList, Pipeline, Backend, Remote> and the
/// projections of Linear (CpuLinear, or CublasLinear with backend::Cuda). With a Remote tier
/// type (tier::RedisTier) and --remote, the prompt's prefix is shared through it.
template <class Index, class TierList = Tiers<tier::HostTier>, class Pipeline = pipeline::Serial, class Backend = backend::Cpu,
          class Linear = CpuLinear, class Remote = tier::NoRemote>
int run(const RunOptions& o, const Model& model, ThreadPool& pool, Backend backend);

template <class Index, class TierList, class Pipeline, class Backend, class Linear>
int run_batch(const RunOptions& o, const Model& model, ThreadPool& pool, Backend backend);

template <class Index, class TierList, class Pipeline, class Backend, class Linear, class Remote>
int run(const RunOptions& o, const Model& model, ThreadPool& pool, Backend backend) {
  if (o.batch > 1) return run_batch<Index, TierList, Pipeline, Backend, Linear>(o, model, pool, std::move(backend));
  const LlamaConfig& c = model.config;
  const Config cfg = manager_config(o, c);
  std::optional<Tokenizer> tokenizer = make_tokenizer(o, model);
  const PromptText text = prompt_text(o, model, tokenizer ? &*tokenizer : nullptr);
  const std::vector<int> prompt = make_prompt(o, c, tokenizer, text);
  constexpr bool tiered = TierList::kCount > 1;
  TierPlan plan;
  if constexpr (tiered) plan = plan_tiers(o, cfg, static_cast<std::int64_t>(prompt.size()) + o.steps);
  using Manager = KvManager<Index, eviction::Lookahead, TierList, Pipeline, Backend, Remote>;
  constexpr bool can_share = !std::is_same_v<Remote, tier::NoRemote>;
  KVD_EXPECT(can_share || o.remote.empty(), "--remote: prefix sharing is not built into this run ({}; it needs hiredis, and --device cpu)",
             o.device);
  KVD_EXPECT(o.shared_prefix >= -1, "--shared-prefix {}: expected a token count, or -1 for the whole prompt", o.shared_prefix);
  std::optional<PrefixDigest> digest;
  [[maybe_unused]] std::conditional_t<can_share, std::optional<Remote>, int> remote{};  // outlives kv
  Manager kv(cfg, {}, eviction::Lookahead{plan.window}, make_tiers<TierList>(o, plan), {}, std::move(backend));
  if constexpr (can_share) {
    if (!o.remote.empty()) {
      typename Remote::Params rp;
      rp.url = o.remote;
      rp.ttl_ms = o.remote_ttl_ms;
      rp.model = model_digest(model);
      remote.emplace(std::move(rp));
      kv.share_prefixes(*remote);
      const std::size_t shared = o.shared_prefix < 0 ? prompt.size() : std::min<std::size_t>(prompt.size(), o.shared_prefix);
      digest = PrefixDigest::of_tokens(std::span<const int>(prompt.data(), shared));
    }
  }
  Decoder<Manager, Linear> decoder(model, kv, pool, o.prefill_chunk, digest);
  if constexpr (tiered) {
    decoder.warm_up_after_prefill(o.warm_up);
    if (o.tune == "on") {  // the three tuned values: cluster size, cache windows, micro-batch
      if constexpr (index::HasClusterSize<Index>)
        if (o.warm_up > 0) decoder.tune_clusters();
      kv.grow_windows({std::max(plan.window, kGrowWindowTo), kGrowSteps});
      if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>) decoder.tune_pipeline();
    }
  }
  std::optional<eval::TraceWriter> trace;
  if (!o.record_trace.empty()) {
    trace.emplace(o.record_trace, cfg.shape, cfg.dtype);
    decoder.record(&*trace);
  }

  if (!o.print_ids)
    fmt::print("kvd-llama: {} ({} layers, dim {}, {}/{} heads, head_dim {}, vocab {}, {:.1f}M parameters, weights {})\n", model.source,
               c.layers, c.dim, c.heads, c.kv_heads, c.head_dim(), c.vocab, static_cast<double>(model.parameters()) / 1e6,
               model.weight_types.empty() ? "F32" : model.weight_types);
  if (!o.print_ids && !text.what.empty()) fmt::print("{}\n", text.what);
  if (!o.print_ids)
    fmt::print("attention: {} ({}) on {}, {} KV, {}-token pages, sink {}, local {}, {} threads; projections: {}; prompt {} tokens, {} steps\n",
               o.mode, Index::name(), o.device, dtype_name(cfg.dtype), cfg.page_tokens, cfg.sink_tokens, cfg.local_tokens,
               pool.threads(), Linear::name(), prompt.size(), o.steps);

  Progress prefill_bar("prefill"), decode_bar("decode");
  const std::vector<float>* logits = &decoder.prefill(prompt, [&](std::int64_t d, std::int64_t t) { prefill_bar.update(d, t); });
  const auto prefill_bytes_read = kv.total_stats().bytes_read;  // warm-up reads, kept apart from decoding's
  Sampler sampler(o.temperature, o.top_p, o.seed);
  std::vector<int> generated;
  // With a tokenizer, the reply is printed as it is generated, and generation ends at an
  // end-of-generation token (EOS, EOT; not printed) unless --ignore-eos.
  const bool stream = tokenizer && !o.print_ids;
  std::vector<int> stops;
  if (tokenizer && !o.ignore_eos) stops = tokenizer->stops();
  std::string reply;
  if (stream) fmt::print("reply: {}", text.reply_prefix), std::fflush(stdout);
  bool ended = false;
  for (int s = 0; s < o.steps; ++s) {
    const int next = sampler.sample(*logits);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      ended = true;
      break;
    }
    generated.push_back(next);
    if (tokenizer) {
      const std::string piece = tokenizer->decode(generated.size() > 1 ? generated[generated.size() - 2] : prompt.back(), next);
      reply += piece;
      if (stream) fmt::print("{}", piece), std::fflush(stdout);
    }
    if (!stream) decode_bar.update(s + 1, o.steps);  // a bar would overwrite the streamed reply
    if (s + 1 < o.steps) logits = &decoder.step(next);
  }
  if (stream) fmt::print("{}\n", ended ? "" : fmt::format(" [{} tokens, no end-of-generation token]", generated.size()));
  const bool answered = !text.expect.empty() && reply_has(reply, text.expect);

  if (trace) trace->close();
  if (o.print_ids) {
    std::string line;
    for (std::size_t i = 0; i < generated.size(); ++i) line += fmt::format("{}{}", i ? " " : "", generated[i]);
    fmt::print("{}\n", line);
  }

  // Summary.
  const DecoderTimes& t = decoder.times();
  const Stats& s = kv.total_stats();
  const double steps = static_cast<double>(std::max<std::uint64_t>(1, s.steps));
  nlohmann::json j;
  j["model"] = model.source;
  j["mode"] = o.mode;
  j["device"] = o.device;
  j["linear"] = Linear::name();
  j["index"] = std::string(Index::name());
  j["budget"] = o.budget;
  j["threads"] = pool.threads();
  j["prompt_tokens"] = t.prefill_tokens;
  j["decode_tokens"] = t.decode_tokens;
  j["prefill_tokens_per_s"] = t.prefill_ms > 0 ? 1000.0 * static_cast<double>(t.prefill_tokens) / t.prefill_ms : 0.0;
  j["decode_tokens_per_s"] = t.decode_ms > 0 ? 1000.0 * static_cast<double>(t.decode_tokens) / t.decode_ms : 0.0;
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
  j["pipeline"] = std::string(Pipeline::name());
  if constexpr (tiered) {
    nlohmann::json windows = nlohmann::json::array();
    for (int l = 0; l < cfg.shape.layers; ++l)
      for (int h = 0; h < cfg.shape.kv_heads; ++h) windows.push_back(kv.window_of(l, h));
    j["tuning"] = {{"enabled", o.tune == "on"},
                   {"pages_per_cluster", decoder.cluster_choice().pages_per_cluster},
                   {"windows", windows},
                   {"micro_batch", decoder.tuned_micro_batch()}};
  }
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
                    {"index_bytes", kv.index_bytes()}};
  if constexpr (can_share) {
    if (remote) {
      const tier::RemoteStats rs = remote->remote_stats();
      j["remote"] = {{"url", remote->url().describe()},
                     {"shared_prefix_tokens", digest->tokens},
                     {"loaded_tokens", t.prefix_loaded_tokens},
                     {"load_ms", t.prefix_load_ms},
                     {"page_hits", rs.hits},
                     {"page_missing", rs.missing},
                     {"page_corrupt", rs.corrupt},
                     {"errors", rs.errors + rs.lookup_errors},
                     {"pages_published", rs.written},
                     {"publish_failed", rs.write_errors + rs.over_budget + rs.dropped}};
    }
  }
  j["generated"] = generated;
  if (tokenizer) j["reply"] = text.reply_prefix + reply;
  j["ended_at_eos"] = ended;
  if (!text.expect.empty()) j["answer"] = {{"expected", text.expect}, {"correct", answered}};
  if (!o.stats_json.empty()) {
    std::ofstream f(o.stats_json);
    KVD_EXPECT(f.good(), "--stats-json: cannot write {}", o.stats_json);
    f << j.dump(2) << "\n";
  }
  if (!o.print_ids) {
    std::string ids;
    for (std::size_t i = 0; i < generated.size() && i < 32; ++i) ids += fmt::format("{} ", generated[i]);
    fmt::print("generated ids: {}{}\n", ids, generated.size() > 32 ? "..." : "");
    fmt::print("\n");
    fmt::print("summary\n");
    fmt::print("  prefill: {} tokens in {:.1f} s = {:.1f} tokens/s (causal attention {:.1f} s)\n", t.prefill_tokens,
               t.prefill_ms / 1000, j["prefill_tokens_per_s"].get<double>(), t.prefill_attention_ms / 1000);
    fmt::print("  decode:  {} tokens in {:.2f} s = {:.2f} tokens/s\n", t.decode_tokens, t.decode_ms / 1000,
               j["decode_tokens_per_s"].get<double>());
    fmt::print("  decode attention per layer step: select {:.3f} ms, classify {:.3f}, fetch {:.3f}, compute {:.3f}, commit {:.3f}; "
               "{:.3f} ms wall ({})\n",
               s.time.select_ms / steps, s.time.classify_ms / steps, s.time.fetch_ms / steps, s.time.compute_ms / steps,
               s.time.commit_ms / steps, s.time.wall_ms / steps, Pipeline::name());
    if constexpr (tiered) {
      if (o.tune == "on") {
        std::string clusters = "not tuned (no warm-up queries, or an index without clusters)";
        if (const auto& cc = decoder.cluster_choice(); !cc.cases.empty()) {
          clusters = fmt::format("{} pages per cluster, of", cc.pages_per_cluster);
          for (const auto& r : cc.cases)
            clusters += fmt::format(" {} ({:.1f} us, recall {:.3f})", r.pages_per_cluster, r.select_us, r.mass_recall);
        }
        int grown = 0, w_min = 1 << 30, w_max = 0;
        for (int l = 0; l < cfg.shape.layers; ++l) {
          grown += kv.window_grown()[static_cast<std::size_t>(l)];
          for (int h = 0; h < cfg.shape.kv_heads; ++h) {
            w_min = std::min(w_min, kv.window_of(l, h));
            w_max = std::max(w_max, kv.window_of(l, h));
          }
        }
        fmt::print("  tuning: cluster size {}; cache windows grew {} times over the first {} steps, W now {}..{} (from {}){}\n", clusters,
                   grown, kGrowSteps, w_min, w_max, plan.window,
                   std::is_same_v<Pipeline, pipeline::Serial> ? std::string()
                                                              : fmt::format("; micro-batch {} streams", decoder.tuned_micro_batch()));
      }
    }
    if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>)
      fmt::print("  pipeline: micro-batches of {} streams{}; select, classify and fetch overlap for {:.3f} ms per layer step; "
                 "bubbles select {:.2f}, classify {:.2f}, fetch {:.2f}; classify waited {:.3f} ms, fetch {:.3f}\n",
                 kv.pipeline_policy().micro_batch_for(static_cast<std::size_t>(cfg.shape.kv_heads)), o.tune == "on" ? " (tuned)" : "",
                 s.time.overlap_ms / steps,
                 s.time.select_bubble(), s.time.classify_bubble(), s.time.fetch_bubble(), s.time.classify_wait_ms / steps,
                 s.time.fetch_wait_ms / steps);
    fmt::print("  linear layers (prefill + decode): {:.2f} s\n", t.linear_ms / 1000);
    if (j.contains("remote")) {
      const auto& r = j["remote"];
      fmt::print("  remote {}: {} of the {}-token shared prefix read instead of computed ({:.1f} s); pages: {} read, {} missing, "
                 "{} corrupt, {} errors; {} published ({} not)\n",
                 r["url"].get<std::string>(), t.prefix_loaded_tokens, digest->tokens, t.prefix_load_ms / 1000, r["page_hits"].get<std::uint64_t>(),
                 r["page_missing"].get<std::uint64_t>(), r["page_corrupt"].get<std::uint64_t>(), r["errors"].get<std::uint64_t>(),
                 r["pages_published"].get<std::uint64_t>(), r["publish_failed"].get<std::uint64_t>());
    }
    if (s.streams > 0)
      fmt::print("  pages selected per stream and step: {:.1f} of {:.1f} candidates; tokens attended {:.0f}\n",
                 static_cast<double>(s.selected) / static_cast<double>(s.streams),
                 static_cast<double>(s.candidates) / static_cast<double>(s.streams),
                 static_cast<double>(s.attended_tokens) / static_cast<double>(s.streams));
    fmt::print("  fast-tier cache: hit rate {:.1f}% ({} hits, {} misses, {} evictions); index {:.1f} MiB\n",
               100 * s.hit_rate(), s.hits, s.misses, s.evictions, static_cast<double>(kv.index_bytes()) / (1 << 20));
    if constexpr (tiered) {
      const auto& ssd = kv.tiers().template get<TierList::kCount - 1>();
      const double mib = 1 << 20;
      fmt::print("  tiers: fast {:.1f} MiB (lookahead W = {}), {}ssd {} ({}, {}, {} pages stored)\n",
                 static_cast<double>(plan.fast_pages * cfg.page_bytes()) / mib, plan.window,
                 TierList::kCount == 3 ? fmt::format("host {:.1f} MiB ({} pages stored), ",
                                                     static_cast<double>(plan.host_pages * cfg.page_bytes()) / mib,
                                                     kv.tiers().template get<1>().stored_pages())
                                       : std::string(),
                 o.ssd_path, ssd.io_name(), ssd.direct_io() ? "O_DIRECT" : "buffered", ssd.stored_pages());
      std::string per_tier;
      for (std::size_t i = 1; i < TierList::kCount; ++i)
        per_tier += fmt::format("{}{} {:.1f} KiB", i > 1 ? ", " : "", i + 1 == TierList::kCount ? "ssd" : "host",
                                static_cast<double>(s.bytes_read[i] - prefill_bytes_read[i]) /
                                    static_cast<double>(std::max<std::uint64_t>(1, t.decode_tokens)) / 1024);
      fmt::print("  bytes read per decoded token (misses, every layer): {}\n", per_tier);
      if (o.warm_up > 0)
        fmt::print("  placement after prefill ({} observation queries, {:.1f} s): {} pages warmed into the cache{}\n", o.warm_up,
                   t.warm_up_ms / 1000, s.warmed, TierList::kCount == 3 ? fmt::format(", {} copied to host", s.placed) : std::string());
    }
    if (!text.expect.empty())
      fmt::print("  answer: {} (expected {} in the reply)\n", answered ? "correct" : "WRONG", text.expect);
  }
  return text.expect.empty() || answered ? 0 : kWrongAnswer;
}

}  // namespace kvdrive::llama

#include "run_batch.hpp"  // run_batch, which builds on the helpers above
