// kvd-llama's options, as main.cpp parses them and the run (run.hpp) reads them, in groups that
// travel on their own (a function that needs one group takes only it; one that reads several
// takes RunOptions), and the exit status of a run whose reply lacks the expected answer.
#pragma once

#include <cstdint>
#include <string>

#include "kvdrive/core/config.hpp"
#include "model/synthetic.hpp"

namespace kvdrive::llama {

/// The model, its tokenizer, and where and how it is computed.
struct ModelOptions {
  std::string path = "synthetic:tiny";  ///< --model: a file or folder, smollm2, or synthetic:NAME (main.cpp's load_model)
  ShapeOverrides shape;                 ///< synthetic models: the shape's overrides
  std::string tokenizer;                ///< a tokenizer file; empty: the model's own (GGUF), if any
  std::string weights = "blocks";       ///< blocks (compute from the GGUF blocks) or f32 (every matrix decoded to float first)
  unsigned threads = 0;                 ///< CPU threads (0: all)
  std::string device = "cpu";           ///< cpu, or cuda (run_cuda.cu)
};

/// The prompt (text, a file, a chat turn, a needle task, ids or a synthetic prompt), what its
/// reply must contain, and --batch's sequences.
struct PromptOptions {
  std::string text;                ///< --prompt
  std::string file;                ///< the prompt's text from a file
  std::string ids;                 ///< --prompt-ids: space-separated token ids
  bool chat = false;               ///< wrap the prompt in the model's chat template
  std::string system;              ///< --chat: the system turn (default: the template's own, if any)
  std::string reply_prefix;        ///< --chat: the first words of the reply, which the model continues
  std::int64_t needle_tokens = 0;  ///< a needle-in-a-haystack task of this many document tokens (needle.hpp)
  double needle_depth = 0.5;
  std::uint64_t needle_seed = 1;
  std::string question;     ///< --needle: asked instead of the magic-number question (the reply is then not checked)
  std::string expect;       ///< the reply must contain this text (the summary says whether it does)
  int batch = 1;            ///< sequences decoded together (run_batch.hpp)
  std::int64_t length = 0;  ///< --prompt-len: a seeded synthetic prompt of this many tokens (0: none)
};

/// How many tokens to generate, and how to sample them.
struct SamplingOptions {
  int steps = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint64_t seed = 1;   ///< sampling and synthetic-prompt seed
  bool ignore_eos = false;  ///< run every --steps even past an end-of-generation token
};

/// The attention: its mode and index, what the index selects, and the KV cache's dtype, pages
/// and prefill chunk (the KvManager's Config, run_manager.hpp).
struct AttentionOptions {
  std::string mode = "sparse";
  std::string index = "hierarchical";
  double budget = 0.0625;
  FocusCarry carry;      ///< sparse and tiered: pages the last step attended heavily stay selected
  ObservationPins pins;  ///< sparse and tiered: pages the prompt's last --warm-up queries attended most stay selected
  /// > 0: the index wrapped by token-level rescoring of pool x budget pages (index::TokenRescore);
  /// 0: off; below 0 (the default): index::TokenRescoreParams' pool for hierarchical, off for the others.
  double rescore_pool = -1;
  std::string dtype = "f16";
  std::string cold_codec = "none";  ///< none, int8 or int4: cold pages coded on the backing tiers (docs/codecs.md)
  int page_tokens = 8, sink_tokens = 4, local_tokens = 64, prefill_chunk = 256;
};

/// Tiered mode's tiers: the fast tier, an optional DRAM tier and the SSD store, the placement
/// after prefill, the pipeline and the tuning.
struct TierOptions {
  std::int64_t fast_bytes = 64ll << 20, host_bytes = 0;
  int warm_up = 32;                 ///< tiered: observation queries for placement after prefill; sparse and tiered: for the pins
  std::string pipeline = "serial";  ///< tiered: serial or elastic
  std::string tune = "on";          ///< tiered: grow the cache windows, tune the micro-batch (neither changes what is selected)
  /// tiered: choose the index's cluster size from the warm-up queries and re-index every layer.
  /// Off by default: it changes what the index selects, so the run no longer decodes --mode
  /// sparse's tokens (Decision 2 compares runs with the same index).
  bool tune_clusters = false;
  std::string ssd_path = "kvd-llama.store";
  bool ssd_pack = true;  ///< tiered: pages of up to 2 KiB packed several to a 4 KiB block of the store
};

/// What is written besides the reply.
struct OutputOptions {
  bool print_ids = false;    ///< print only the generated ids (no header, reply or summary)
  std::string stats_json;    ///< write the closing summary as JSON to this file
  std::string record_trace;  ///< write Q, K and V per layer and position to this file (docs/trace-format.md)
};

/// Sharing the prompt's prefix: through a Redis server (tier::RedisTier), or a local folder kept
/// across runs (tier::PrefixStore).
struct SharingOptions {
  std::string remote;                                       ///< redis://... or unix://...; empty: no sharing
  std::int64_t remote_ttl_ms = 0;                           ///< expiry of the pages it stores (0: none)
  std::string remote_secret_file;                           ///< the deployment's shared secret (keyed values); empty: none
  std::string prefix_store;                                 ///< a folder; empty: none
  std::int64_t prefix_store_bytes = std::int64_t{8} << 30;  ///< its capacity (least recently used pages go first)
  std::int64_t shared_prefix = -1;                          ///< prompt tokens that form the shared prefix (-1: the whole prompt)
};

/// kvd-llama's options (main.cpp parses them), by group.
struct RunOptions {
  ModelOptions model;
  PromptOptions prompt;
  SamplingOptions sampling;
  AttentionOptions attention;
  TierOptions tiers;
  OutputOptions output;
  SharingOptions sharing;
};

/// kvd-llama's exit status when the reply lacks the --expect (or --needle) answer.
constexpr int kWrongAnswer = 3;

}  // namespace kvdrive::llama
