// kvd-llama's run: everything between parsing the options (main.cpp) and the exit code. It
// builds the prompt, the tiers and the KvManager, prefills, decodes and prints the summary.
// main.cpp runs it on the CPU; run_cuda.cu instantiates it with cuda::DeviceTier, backend::Cuda
// and CublasLinear for --device cuda.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
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

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "chat.hpp"
#include "decoder.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/prefix_store.hpp"
#include "kvdrive/tier/remote_choice.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "linear.hpp"
#include "model.hpp"
#include "needle.hpp"
#include "sampler.hpp"
#include "summary.hpp"
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
  std::string question;  ///< --needle: asked instead of the magic-number question (the reply is then not checked)
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
  FocusCarry carry;                 ///< sparse and tiered: pages the last step attended heavily stay selected
  ObservationPins pins;             ///< sparse and tiered: pages the prompt's last --warm-up queries attended most stay selected
  std::string index = "hierarchical";
  /// > 0: the index wrapped by token-level rescoring of pool x budget pages (index::TokenRescore);
  /// 0: off; below 0 (the default): index::TokenRescoreParams' pool for hierarchical, off for the others.
  double rescore_pool = -1;
  unsigned threads = 0;
  bool print_ids = false;
  std::string stats_json;
  std::string record_trace;
  std::string dtype = "f16";
  std::string cold_codec = "none";  ///< none, int8 or int4: cold pages coded on the backing tiers (docs/codecs.md)
  int page_tokens = 8, sink_tokens = 4, local_tokens = 64, prefill_chunk = 256;
  // tiered mode
  std::int64_t fast_bytes = 64ll << 20, host_bytes = 0;
  int warm_up = 32;  ///< tiered: observation queries for placement after prefill; sparse and tiered: for the pins
  std::string pipeline = "serial";  ///< tiered: serial or elastic
  std::string tune = "on";          ///< tiered: tune cluster size, cache windows and micro-batch
  std::string ssd_path = "kvd-llama.store";
  bool ssd_pack = true;             ///< tiered: pages of up to 2 KiB packed several to a 4 KiB block of the store
  std::string device = "cpu";       ///< cpu, or cuda (run_cuda.cu)
  // sharing the prompt's prefix: through a Redis server (tier::RedisTier), or a local folder kept
  // across runs (tier::PrefixStore)
  std::string remote;               ///< redis://... or unix://...; empty: no sharing
  std::int64_t remote_ttl_ms = 0;   ///< expiry of the pages it stores (0: none)
  std::string remote_secret_file;   ///< the deployment's shared secret (keyed values); empty: none
  std::string prefix_store;         ///< a folder; empty: none
  std::int64_t prefix_store_bytes = std::int64_t{8} << 30;  ///< its capacity (least recently used pages go first)
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
  std::size_t host_alignment = 4096;  ///< the host tier's slot alignment: 64 for coded pages (packed tighter)
  int window = 3;
};

/// Bytes of the host tier's slot for one page: a coded page (--cold-codec) rounded to 64 bytes,
/// else the page in the KV dtype.
inline std::size_t host_slot_bytes(const Config& cfg) {
  if (!cfg.cold_codec.coded()) return cfg.page_bytes();
  return (cfg.stored_page_bytes() + 63) / 64 * 64;
}

/// The fast tier's least pages for `sequences` sequences of `context` tokens: per stream sink,
/// local and tail, and a step's misses staged; plus one layer's prefill chunk. A lookahead cache
/// of window W needs W x budget() more pages per stream.
struct FastTierNeed {
  std::size_t pages = 0;    ///< without a cache
  std::size_t streams = 0;  ///< (layer, KV head, sequence) streams
  std::size_t budget = 0;   ///< pages a stream selects per step
};

inline FastTierNeed fast_tier_need(int prefill_chunk, const Config& cfg, std::int64_t context, std::size_t sequences = 1) {
  FastTierNeed n;
  n.streams = static_cast<std::size_t>(cfg.shape.layers) * cfg.shape.kv_heads * sequences;
  const PageRanges r = page_ranges(context + 1, cfg.page_tokens, cfg.sink_tokens, cfg.local_tokens);
  n.budget = static_cast<std::size_t>(cfg.budget.pages_for(r.candidates()));
  n.pages = n.streams * (static_cast<std::size_t>(eviction::resident_pages(cfg, context)) + n.budget) +
            static_cast<std::size_t>(cfg.shape.kv_heads) * static_cast<std::size_t>((prefill_chunk + cfg.page_tokens - 1) / cfg.page_tokens + 1);
  return n;
}

inline TierPlan plan_tiers(const RunOptions& o, const Config& cfg, std::int64_t context, std::size_t sequences = 1) {
  const FastTierNeed n = fast_tier_need(o.prefill_chunk, cfg, context, sequences);
  const std::size_t need = n.pages, streams = n.streams, budget = n.budget;
  TierPlan p;
  p.fast_pages = static_cast<std::size_t>(o.fast_bytes) / cfg.page_bytes();
  KVD_EXPECT(p.fast_pages >= need,
             "--fast-bytes {}: the fast tier needs at least {} bytes ({} pages of {} bytes: sink, local and staging for {} streams "
             "at {} tokens, and a prefill chunk)",
             o.fast_bytes, need * cfg.page_bytes(), need, cfg.page_bytes(), streams, context);
  p.window = budget ? static_cast<int>(std::min<std::size_t>(8, (p.fast_pages - need) / (streams * budget))) : 8;
  p.host_pages = static_cast<std::size_t>(o.host_bytes) / host_slot_bytes(cfg);
  if (cfg.cold_codec.coded()) p.host_alignment = 64;  // the host tier only memcpys: no direct I/O into it
  return p;
}

template <class TierList>
TierList make_tiers(const RunOptions& o, const TierPlan& p) {
  if constexpr (TierList::kCount == 1) {
    return TierList{};
  } else {
    tier::SsdTier::Params sp;
    sp.path = o.ssd_path;
    sp.mode = tier::SsdOpen::recreate;  // a fresh store per run, under its lock, never over a file that is not a store
    sp.pack_pages = o.ssd_pack;
    using Fast = typename TierList::template Type<0>;  // HostTier, or cuda::DeviceTier
    Fast fast(typename Fast::Params{p.fast_pages});
    if constexpr (TierList::kCount == 2)
      return TierList(std::move(fast), tier::SsdTier(sp));
    else
      return TierList(std::move(fast), tier::HostTier(tier::HostTier::Params{p.host_pages, p.host_alignment}), tier::SsdTier(sp));
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
    if (o.question.empty()) {
      p.text = t.prompt;
      if (p.reply_prefix.empty()) p.reply_prefix = t.reply_prefix;
      if (p.expect.empty()) p.expect = t.answer;
    } else {  // the same document, another question
      p.text = t.prompt.substr(0, t.prompt.size() - t.question.size()) + o.question;
    }
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

/// The rescoring pool the run uses (RunOptions::rescore_pool with its default resolved): 0 for none.
inline double rescore_pool_of(const RunOptions& o) {
  if (o.rescore_pool >= 0) return o.rescore_pool;
  return o.index == "hierarchical" && o.mode != "dense" ? index::TokenRescoreParams{}.pool : 0.0;
}

/// The KvManager's configuration for the run's options.
inline Config manager_config(const RunOptions& o, const LlamaConfig& c) {
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.page_tokens = o.page_tokens;
  cfg.sink_tokens = o.sink_tokens;
  cfg.local_tokens = o.local_tokens;
  cfg.dtype = o.dtype == "f32" ? DType::f32 : o.dtype == "bf16" ? DType::bf16 : DType::f16;
  cfg.budget = Budget::fraction(o.budget);
  cfg.carry = o.carry;
  cfg.carry.validate();
  cfg.pins = o.pins;
  KVD_EXPECT(!o.pins.enabled() || o.warm_up > 0, "observation pins rank pages by the prompt's last --warm-up queries: --warm-up must be > 0");
  cfg.pins.validate();
  cfg.cold_codec = {codec::parse_codec(o.cold_codec)};
  return cfg;
}

/// The run's index, with the parameters that depend on the model set from it: Hierarchical's
/// pair radii are taken over the channel pairs the model's RoPE rotates together (adjacent
/// channels in GGUF and llama2.c files, the two halves of the head in Hugging Face checkpoints).
/// A wrapper (TokenRescore, OutlierPages) wraps its inner index made so; TokenRescore takes the
/// pool given (> 0) or its default.
/// Other indices are default-constructed.
template <class Index>
Index index_for(const LlamaConfig& c, double rescore_pool = 0) {
  if constexpr (requires { typename Index::InnerIndex; }) {
    typename Index::Params p;
    if constexpr (requires { p.pool; })
      if (rescore_pool > 0) p.pool = rescore_pool;
    if constexpr (requires { p.rotary = index::RotaryPairs::adjacent; })
      p.rotary = c.rope_layout == RopeLayout::half ? index::RotaryPairs::halves : index::RotaryPairs::adjacent;
    return Index(index_for<typename Index::InnerIndex>(c, rescore_pool), p);
  } else if constexpr (requires(typename Index::Params p) { p.rotary = index::RotaryPairs::adjacent; }) {
    typename Index::Params p;
    p.rotary = c.rope_layout == RopeLayout::half ? index::RotaryPairs::halves : index::RotaryPairs::adjacent;
    return Index(p);
  } else {
    return Index{};
  }
}

/// --tokenizer's file, else the model's own (GGUF), else none.
inline std::optional<Tokenizer> make_tokenizer(const RunOptions& o, const Model& model) {
  std::optional<Tokenizer> t;
  if (!o.tokenizer.empty()) t.emplace(o.tokenizer, model.config.vocab);
  else if (model.vocab) t.emplace(*model.vocab);
  return t;
}

/// What a sequence decodes: the prompt's text (prompt_text) and its ids (make_prompt).
struct PromptInput {
  PromptText text;
  std::vector<int> ids;
};

inline PromptInput prompt_input(const RunOptions& o, const Model& model, const std::optional<Tokenizer>& tokenizer) {
  PromptInput in;
  in.text = prompt_text(o, model, tokenizer ? &*tokenizer : nullptr);
  in.ids = make_prompt(o, model.config, tokenizer, in.text);
  return in;
}

/// The ids of the tokens that end generation: the tokenizer's, unless --ignore-eos.
inline std::vector<int> stop_tokens(const RunOptions& o, const std::optional<Tokenizer>& tokenizer) {
  std::vector<int> stops;
  if (tokenizer && !o.ignore_eos) stops = tokenizer->stops();
  return stops;
}

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

/// --remote-secret-file: the file's bytes, less one trailing newline. A file that other users
/// may read is refused (as ssh refuses such a key): the secret is what keeps forged pages out.
inline std::string read_secret_file(const std::string& path) {
  struct stat st {};
  KVD_EXPECT(::stat(path.c_str(), &st) == 0, "--remote-secret-file {}: {}", path, std::strerror(errno));
  KVD_EXPECT((st.st_mode & 0077) == 0, "--remote-secret-file {}: other users may read or write it (mode {:o}); chmod 600 it", path,
             st.st_mode & 0777);
  std::string secret = read_text_file(path);
  if (secret.ends_with('\n')) secret.pop_back();
  if (secret.ends_with('\r')) secret.pop_back();
  return secret;
}

/// --remote or --prefix-store: the tier that shares the prompt's prefix (it outlives the manager
/// that reads and publishes through it) and the prompt tokens it shares page by page. Remote is
/// tier::NoRemote (sharing not built in: both options are refused) or a tier::RemoteChoice
/// holding a tier::PrefixStore, and a RedisTier when it names one as Remote::Redis (hiredis).
template <class Remote>
struct PrefixShare {
  static constexpr bool kBuiltIn = !std::is_same_v<Remote, tier::NoRemote>;
  static constexpr bool kRedis = requires { typename Remote::Redis; };
  std::conditional_t<kBuiltIn, Remote, int> remote{};
  bool on = false;
  std::vector<int> shared;  ///< the prompt's leading tokens whose whole pages are shared

  static void check(const RunOptions& o) {
    const char* what = !o.remote.empty() ? "--remote" : "--prefix-store";
    KVD_EXPECT(kBuiltIn || (o.remote.empty() && o.prefix_store.empty()), "{}: prefix sharing is not built into this run ({}; it needs --device cpu)",
               what, o.device);
    KVD_EXPECT(kRedis || o.remote.empty(), "--remote: this kvd-llama was built without hiredis (install libhiredis-dev and build again)");
    KVD_EXPECT(o.remote.empty() || o.prefix_store.empty(), "--remote and --prefix-store: choose one");
    KVD_EXPECT(o.shared_prefix >= -1, "--shared-prefix {}: expected a token count, or -1 for the whole prompt", o.shared_prefix);
    KVD_EXPECT(o.prefix_store_bytes > 0, "--prefix-store-bytes {}: expected a positive byte count", o.prefix_store_bytes);
  }

  /// Opens --prefix-store or connects to --remote, if given, and shares the prompt's prefix with `kv`.
  template <class Manager>
  void connect(const RunOptions& o, const Model& model, Manager& kv, const std::vector<int>& prompt) {
    if constexpr (kBuiltIn) {
      if (!o.prefix_store.empty()) {
        remote.template emplace<tier::PrefixStore>(tier::PrefixStore::Params{
            .dir = o.prefix_store, .model = model_digest(model), .capacity_bytes = static_cast<std::uint64_t>(o.prefix_store_bytes)});
      } else if (!o.remote.empty()) {
        if constexpr (kRedis) {
          typename Remote::Redis::Params rp;
          rp.url = o.remote;
          rp.ttl_ms = o.remote_ttl_ms;
          rp.model = model_digest(model);
          if (!o.remote_secret_file.empty()) rp.secret = read_secret_file(o.remote_secret_file);
          remote.template emplace<typename Remote::Redis>(std::move(rp));
        }
      } else {
        return;
      }
      kv.share_prefixes(remote);
      on = true;
      const std::size_t n = o.shared_prefix < 0 ? prompt.size() : std::min<std::size_t>(prompt.size(), o.shared_prefix);
      shared.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n));
    } else {
      (void)o, (void)model, (void)kv, (void)prompt;
    }
  }

  /// The summary's account of the sharing (none without --remote or --prefix-store).
  std::optional<RemoteSummary> summary() const {
    if constexpr (kBuiltIn) {
      if (!on) return std::nullopt;
      const tier::RemoteStats rs = remote.remote_stats();
      return RemoteSummary{remote.describe(), static_cast<std::int64_t>(shared.size()), rs.hits, rs.missing, rs.corrupt, rs.errors + rs.lookup_errors,
                           rs.written, rs.write_errors + rs.over_budget + rs.dropped};
    } else {
      return std::nullopt;
    }
  }
};

/// Tiered runs: placement after prefill from --warm-up queries, and with --tune on the three
/// tuned values (cluster size, cache windows, micro-batch).
template <class Index, class Pipeline, class Manager, class Dec>
void set_up_tiered(const RunOptions& o, const TierPlan& plan, Manager& kv, Dec& decoder) {
  decoder.warm_up_after_prefill(o.warm_up);
  if (o.tune != "on") return;
  if constexpr (index::HasClusterSize<Index>)
    if (o.warm_up > 0) decoder.tune_clusters();
  kv.grow_windows({std::max(plan.window, kGrowWindowTo), kGrowSteps});
  if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>) decoder.tune_pipeline();
}

/// The lines before prefill: the model, the task (if any), the attention and the prompt.
template <class Index, class Linear>
void print_run_header(const RunOptions& o, const Model& model, const Config& cfg, const PromptInput& in, unsigned threads) {
  const LlamaConfig& c = model.config;
  fmt::print("kvd-llama: {} ({}, vocab {}, {:.1f}M parameters, weights {})\n", model.source, shape_text(c), c.vocab,
             static_cast<double>(model.parameters()) / 1e6, weights_text(model));
  if (!in.text.what.empty()) fmt::print("{}\n", in.text.what);
  const std::string cold =
      cfg.cold_codec.coded()
          ? fmt::format(", cold pages {} ({} of {} bytes)", cfg.cold_codec.name(),
                        cfg.stored_page_bytes(), cfg.page_bytes())
          : std::string();
  fmt::print("attention: {} ({}) on {}, {} KV, {}-token pages{}, sink {}, local {}, {} threads; projections: {}; prompt {} tokens, {} steps\n",
             o.mode, Index::name(), o.device, dtype_name(cfg.dtype), cfg.page_tokens, cold, cfg.sink_tokens, cfg.local_tokens, threads,
             Linear::name(), in.ids.size(), o.steps);
}

/// What decoding gave: the ids, the reply's text (with a tokenizer), and whether an
/// end-of-generation token ended it.
struct Decoded {
  std::vector<int> generated;
  std::string reply;
  bool ended = false;
};

/// Samples up to --steps tokens from `logits` (prefill's) on. With a tokenizer, the reply is
/// printed as it is generated, and generation ends at an end-of-generation token (EOS, EOT; not
/// printed) unless --ignore-eos.
template <class Dec>
Decoded decode(const RunOptions& o, const std::optional<Tokenizer>& tokenizer, const PromptInput& in, Dec& decoder,
               const std::vector<float>* logits) {
  Progress decode_bar("decode");
  Sampler sampler(o.temperature, o.top_p, o.seed);
  const bool stream = tokenizer && !o.print_ids;
  const std::vector<int> stops = stop_tokens(o, tokenizer);
  Decoded out;
  if (stream) fmt::print("reply: {}", in.text.reply_prefix), std::fflush(stdout);
  for (int s = 0; s < o.steps; ++s) {
    const int next = sampler.sample(*logits);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      out.ended = true;
      break;
    }
    out.generated.push_back(next);
    if (tokenizer) {
      const std::string piece = tokenizer->decode(out.generated.size() > 1 ? out.generated[out.generated.size() - 2] : in.ids.back(), next);
      out.reply += piece;
      if (stream) fmt::print("{}", piece), std::fflush(stdout);
    }
    if (!stream) decode_bar.update(s + 1, o.steps);  // a bar would overwrite the streamed reply
    if (s + 1 < o.steps) logits = &decoder.step(next);
  }
  if (stream) fmt::print("{}\n", out.ended ? "" : fmt::format(" [{} tokens, no end-of-generation token]", out.generated.size()));
  return out;
}

inline void print_ids_line(const std::vector<int>& generated) {
  std::string line;
  for (std::size_t i = 0; i < generated.size(); ++i) line += fmt::format("{}{}", i ? " " : "", generated[i]);
  fmt::print("{}\n", line);
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
TuningSummary tuning_summary(const RunOptions& o, const TierPlan& plan, const Manager& kv, const Dec& decoder) {
  const auto& shape = kv.config().shape;
  TuningSummary tu;
  tu.enabled = o.tune == "on";
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
TierSummary tier_summary(const RunOptions& o, const TierPlan& plan, Manager& kv, const ReadMark& prefill, std::int64_t decoded) {
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
  r.mode = o.mode;
  r.device = o.device;
  r.linear = Linear::name();
  r.index = std::string(Index::name());
  r.pipeline = std::string(Pipeline::name());
  r.budget = o.budget;
  r.threads = threads;
  r.times = decoder.times();
  r.stats = kv.total_stats();
  r.index_bytes = kv.index_bytes();
  if constexpr (TierList::kCount > 1) {
    r.tuning = tuning_summary(o, plan, kv, decoder);
    r.tiers = tier_summary<TierList>(o, plan, kv, prefill, r.times.decode_tokens);
  }
  if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>)
    r.overlapped = PipelineSummary{kv.pipeline_policy().micro_batch_for(static_cast<std::size_t>(kv.config().shape.kv_heads)), o.tune == "on"};
  r.remote = share.summary();
  return r;
}

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
  // Load: the prompt, the tiers, the manager and the decoder.
  const Config cfg = manager_config(o, model.config);
  const std::optional<Tokenizer> tokenizer = make_tokenizer(o, model);
  const PromptInput in = prompt_input(o, model, tokenizer);
  constexpr bool tiered = TierList::kCount > 1;
  TierPlan plan;
  if constexpr (tiered) plan = plan_tiers(o, cfg, static_cast<std::int64_t>(in.ids.size()) + o.steps);
  using Manager = KvManager<Index, eviction::Lookahead, TierList, Pipeline, Backend, Remote>;
  PrefixShare<Remote>::check(o);
  PrefixShare<Remote> share;  // outlives kv
  Manager kv(cfg, index_for<Index>(model.config, rescore_pool_of(o)), eviction::Lookahead{plan.window}, make_tiers<TierList>(o, plan), {}, std::move(backend));
  share.connect(o, model, kv, in.ids);
  Decoder<Manager, Linear> decoder(model, kv, pool, o.prefill_chunk, std::span<const int>(share.shared));
  if constexpr (tiered) set_up_tiered<Index, Pipeline>(o, plan, kv, decoder);
  else if (cfg.pins.enabled()) decoder.warm_up_after_prefill(o.warm_up);  // ranks the pages to pin (KvManager::warm_up)
  std::optional<eval::TraceWriter> trace;
  if (!o.record_trace.empty()) {
    trace.emplace(o.record_trace, cfg.shape, cfg.dtype);
    decoder.record(&*trace);
  }
  if (!o.print_ids) print_run_header<Index, Linear>(o, model, cfg, in, pool.threads());

  // Prefill, then decode.
  Progress prefill_bar("prefill");
  const std::vector<float>& first = decoder.prefill(in.ids, [&](std::int64_t d, std::int64_t t) { prefill_bar.update(d, t); });
  const ReadMark prefill = read_mark<TierList>(kv);  // warm-up reads, kept apart from decoding's
  const Decoded out = decode(o, tokenizer, in, decoder, &first);
  if (trace) trace->close();
  if (o.print_ids) print_ids_line(out.generated);

  // Summary: gathered once, written as JSON and printed as text.
  RunSummary summary = run_summary<Index, TierList, Pipeline, Linear>(o, model, pool.threads(), plan, kv, decoder, prefill, share);
  summary.reply = reply_summary(out, in.text, tokenizer.has_value());
  summary.ended_at_eos = out.ended;
  write_stats_json(o.stats_json, run_json(summary));
  if (!o.print_ids) print_run_summary(summary);
  return summary.reply.expected.empty() || summary.reply.correct ? 0 : kWrongAnswer;
}

}  // namespace kvdrive::llama

#include "run_batch.hpp"  // run_batch, which builds on the helpers above
