// Decoder: the Llama forward pass (forward.hpp: RMSNorm, RoPE, SwiGLU, final norm, logits) with
// every attention of decoding done by a kvdrive::KvManager. One sequence per decoder.
//
// Prefill runs in chunks of tokens through all layers: projections as matrix products, causal
// attention of the chunk over the prompt so far (kept in the KV dtype per KV head while
// prefilling: PromptKv), then the chunk's K/V go to KvManager::prefill. Decoding calls
// KvManager::attend once per layer. With warm_up_after_prefill(n), the queries of the prompt's
// last n positions are kept per layer and each layer is warmed up (KvManager::warm_up: the best
// pages into the cache, the next into middle tiers) once the prompt is in. With a manager that
// shares prefixes through a remote tier (KvManager::share_prefixes), prefill first loads the
// longest run of the prompt's shared prefix that another engine published
// (KvManager::load_prefix) and computes only the tokens after it.
//
// For benchmarks that compare managers on the same work: keep_prefill() records what prefill
// gave the manager (every layer's K/V, the warm-up queries, the last logits) in a
// PrefillSnapshot, and prefill_from() hands a snapshot to another decoder's manager without
// computing the prompt again, so that decoder continues exactly as if it had prefilled itself.
// teacher_force() returns the logits at every position of a text.
//
// decoder_batch.hpp's BatchDecoder decodes several Decoders' sequences together.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/eval/trace.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/manager.hpp"
#include "decoder/decoder_snapshot.hpp"
#include "decoder/forward.hpp"
#include "kernels/linear.hpp"
#include "model/model.hpp"
#include "kernels/prefill_attention.hpp"
#include "kernels/rope.hpp"

namespace kvdrive::llama {

/// Wall time spent in each part of the forward pass, in milliseconds.
struct DecoderTimes {
  double prefill_ms = 0, decode_ms = 0;
  double prefill_attention_ms = 0;        ///< causal attention inside prefill
  double warm_up_ms = 0;                  ///< KvManager::warm_up after prefill (part of prefill_ms)
  double prefix_load_ms = 0;              ///< KvManager::load_prefix: the shared prefix read from the remote tier (part of prefill_ms)
  std::int64_t prefix_loaded_tokens = 0;  ///< prompt tokens read from the remote tier instead of computed
  double linear_ms = 0;                   ///< projections, FFN and logits
  std::int64_t prefill_tokens = 0, decode_tokens = 0;
};

/// Linear: where the projections, FFN and logits run (CpuLinear, or CublasLinear on a GPU),
/// constructed from the decoder's thread pool.
template <class Manager, class Linear = CpuLinear>
class Decoder {
 public:
  /// prefill_chunk: tokens per prefill chunk.
  /// digest: identifies the prompt's prefix for a remote tier (KvManager::add_sequence).
  Decoder(const Model& model, Manager& kv, ThreadPool& pool, int prefill_chunk = 256, std::optional<PrefixDigest> digest = std::nullopt)
      : Decoder(AddWith{}, model, kv, pool, prefill_chunk, [&] { return kv.add_sequence(digest); }) {}
  /// shared_tokens: the prompt's leading token ids that remote tiers share page by page (a
  /// prompt that begins with the same pages reads them back, whatever follows).
  Decoder(const Model& model, Manager& kv, ThreadPool& pool, int prefill_chunk, std::span<const int> shared_tokens)
      : Decoder(AddWith{}, model, kv, pool, prefill_chunk, [&] { return kv.add_sequence(shared_tokens); }) {}
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder() { kv_.release(seq_); }

 private:
  struct AddWith {};  // the constructor below starts the sequence with add_sequence()
  template <class AddSequence>
  Decoder(AddWith, const Model& model, Manager& kv, ThreadPool& pool, int prefill_chunk, AddSequence&& add_sequence)
      : c_(model.config), kv_(kv), pool_(pool), fwd_(model, pool), chunk_(prefill_chunk) {
    KVD_EXPECT(prefill_chunk >= 1, "prefill chunk {} must be >= 1", prefill_chunk);
    const auto& s = kv.config().shape;
    KVD_EXPECT(s.layers == c_.layers && s.q_heads == c_.heads && s.kv_heads == c_.kv_heads && s.head_dim == c_.head_dim(),
               "decoder: the KvManager's shape ({} layers, {}/{} heads, head_dim {}) does not match the model's "
               "({} layers, {}/{} heads, head_dim {})",
               s.layers, s.q_heads, s.kv_heads, s.head_dim, c_.layers, c_.heads, c_.kv_heads, c_.head_dim());
    seq_ = add_sequence();
    logits_.resize(static_cast<std::size_t>(c_.vocab));
  }

 public:
  /// For benchmarks of long contexts that a CPU cannot prefill: the caller has stored `tokens`
  /// tokens of K/V for every layer straight into the manager (KvManager::prefill on sequence()),
  /// and decoding continues from there.
  void adopt_context(std::int64_t tokens) {
    KVD_EXPECT(pos_ == 0, "adopt_context: the decoder has already run {} tokens", pos_);
    for (int l = 0; l < c_.layers; ++l)
      KVD_EXPECT(kv_.length(seq_, l) == tokens, "adopt_context: layer {} holds {} tokens, not {}", l, kv_.length(seq_, l), tokens);
    pos_ = tokens;
  }

  /// After prefill, warm up every layer from the queries of the prompt's last `observed`
  /// positions (0: no warm-up). Prompts shorter than that use all their positions.
  void warm_up_after_prefill(int observed) {
    KVD_EXPECT(observed >= 0, "warm_up_after_prefill: {} observation queries", observed);
    observed_ = observed;
  }

  /// Calibrates the manager's pipeline (KvManager::tune) on layer 0 of the first decode step.
  void tune_pipeline() { tune_ = true; }
  /// After prefill (before warm-up), chooses the index's cluster size on layer 0 from the
  /// warm-up observation queries (KvManager::tune_clusters) and re-indexes the other layers
  /// with it. Needs warm_up_after_prefill(n > 0) and an index with a cluster size.
  void tune_clusters() { tune_clusters_ = true; }
  /// What tune_clusters chose (empty before, or without it).
  const index::ClusterSizeChoice& cluster_choice() const { return cluster_choice_; }
  /// The micro-batch size tune chose (0 before, or if the pipeline has none).
  std::size_t tuned_micro_batch() const { return tuned_; }

  /// The next prefill also records what it gives the manager into `snap` (nullptr: stop).
  void keep_prefill(PrefillSnapshot* snap) { snap_ = snap; }

  /// Starts this decoder's sequence from another decoder's prefill, without computing the prompt:
  /// the same K/V go to this manager in the same chunks, then the same warm-up (this decoder's
  /// warm_up_after_prefill and tune_clusters settings apply, with at most the snapshot's queries).
  /// The snapshot must come from a manager of the same KV dtype (prefill attends K/V rounded to
  /// it) and a decoder of the same Linear policy; then this decoder continues as if it had
  /// prefilled the prompt itself.
  const std::vector<float>& prefill_from(const PrefillSnapshot& snap) {
    KVD_EXPECT(pos_ == 0, "prefill_from: the decoder has already run {} tokens", pos_);
    check_snapshot(snap, c_, kv_.config().dtype, observed_);
    const auto t0 = Clock::now();
    const int kvh = c_.kv_heads, d = c_.head_dim();
    const auto row = static_cast<std::size_t>(kvh) * d;
    for (std::int64_t p0 = 0; p0 < snap.tokens; p0 += snap.chunk) {
      const std::int64_t len = std::min<std::int64_t>(snap.chunk, snap.tokens - p0);
      for (int l = 0; l < c_.layers; ++l)
        kv_.prefill(seq_, l, make_view(snap.k[static_cast<std::size_t>(l)].data() + static_cast<std::size_t>(p0) * row, len, kvh, d),
                    make_view(snap.v[static_cast<std::size_t>(l)].data() + static_cast<std::size_t>(p0) * row, len, kvh, d));
    }
    pos_ = snap.tokens;
    const std::int64_t obs = std::min<std::int64_t>(observed_, snap.observed);
    if (obs > 0) finish_prefill(last_queries(snap, obs, c_), obs);
    logits_ = snap.logits;
    times_.prefill_tokens += snap.tokens;
    times_.prefill_ms += ms_since(t0);
    return logits_;
  }

  /// The logits after every token of `tokens` (a fresh decoder's whole text, run as a prompt):
  /// row i predicts token i + 1.
  std::vector<std::vector<float>> teacher_force(std::span<const int> tokens) {
    all_logits_.clear();
    keep_all_logits_ = true;
    try {
      prefill(tokens);
    } catch (...) {
      keep_all_logits_ = false;
      throw;
    }
    keep_all_logits_ = false;
    return std::exchange(all_logits_, {});
  }

  /// Records Q (after RoPE), K (after RoPE) and V of every layer and position from now on.
  void record(eval::TraceWriter* trace) { trace_ = trace; }

  SeqId sequence() const { return seq_; }
  std::int64_t position() const { return pos_; }
  const DecoderTimes& times() const { return times_; }
  const std::vector<float>& logits() const { return logits_; }

  /// Runs the prompt (at least one token) and returns the logits after its last token.
  /// progress(done, total) is called after each chunk.
  const std::vector<float>& prefill(std::span<const int> tokens, const std::function<void(std::int64_t, std::int64_t)>& progress = {}) {
    KVD_EXPECT(!tokens.empty(), "prefill: empty prompt");
    KVD_EXPECT(pos_ == 0, "prefill: the decoder has already run {} tokens", pos_);
    check_tokens(tokens);
    const auto t0 = Clock::now();
    const auto n = static_cast<std::int64_t>(tokens.size());
    prompt_kv_.start(kv_.config().dtype, static_cast<std::size_t>(c_.layers) * c_.kv_heads, c_.head_dim(), n);
    obs_first_ = n - std::min<std::int64_t>(observed_, n);
    obs_q_.assign(observed_ > 0 ? static_cast<std::size_t>(c_.layers) : 0, {});
    const std::int64_t loaded = load_shared_prefix(n);
    if (snap_ != nullptr) begin_snapshot(n, loaded);
    for (std::int64_t p0 = loaded; p0 < n; p0 += chunk_) {
      const std::int64_t len = std::min<std::int64_t>(chunk_, n - p0);
      prefill_chunk(tokens.subspan(static_cast<std::size_t>(p0), static_cast<std::size_t>(len)), p0);
      if (progress) progress(p0 + len, n);
    }
    prompt_kv_.clear();
    pos_ = n;  // the prompt is in the manager, whatever warm-up does
    if (snap_ != nullptr) end_snapshot(n);
    if (observed_ > 0) finish_prefill(std::exchange(obs_q_, {}), n - obs_first_);
    times_.prefill_tokens += n;
    times_.prefill_ms += ms_since(t0);
    return logits_;
  }

  /// Decodes one token at the next position; returns the logits that follow it.
  const std::vector<float>& step(int token) {
    const std::span<const int> tokens(&token, 1);
    check_tokens(tokens);
    const auto t0 = Clock::now();
    fwd_.embed(tokens);
    const SeqId batch[] = {seq_};
    fwd_.layers([&](std::size_t) { return pos_; },
                [&](int l) {
                  if (trace_) trace_->write(l, pos_, fwd_.q(0), fwd_.k(0), fwd_.v(0));
                  if (tune_ && l == 0) calibrate_pipeline(l, batch);
                  kv_.attend(l, batch, fwd_.q_view(), fwd_.k_view(), fwd_.v_view(), fwd_.att_view());
                });
    fwd_.logits(0, logits_.data());
    ++pos_;
    ++times_.decode_tokens;
    times_.linear_ms += fwd_.take_linear_ms();
    times_.decode_ms += ms_since(t0);
    return logits_;
  }

 private:
  template <class M, class L>
  friend class BatchDecoder;
  using Clock = std::chrono::steady_clock;
  static double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

  /// After the prompt is in: the cluster size tuned (if asked) and every layer warmed up from
  /// the last `observed` prompt queries.
  void finish_prefill(const std::vector<std::vector<float>>& obs_q, std::int64_t observed) {
    const auto tw = Clock::now();
    if constexpr (requires { kv_.tune_clusters(seq_, 0, make_view(obs_q[0].data(), 1, c_.heads, c_.head_dim())); }) {
      if (tune_clusters_) {
        cluster_choice_ = kv_.tune_clusters(seq_, 0, make_view(obs_q[0].data(), observed, c_.heads, c_.head_dim()));
        for (int l = 1; l < c_.layers; ++l) kv_.reindex(seq_, l);
      }
    }
    for (int l = 0; l < c_.layers; ++l) kv_.warm_up(seq_, l, make_view(obs_q[static_cast<std::size_t>(l)].data(), observed, c_.heads, c_.head_dim()));
    times_.warm_up_ms += ms_since(tw);
  }

  void check_tokens(std::span<const int> tokens) const {
    for (int t : tokens) KVD_EXPECT(t >= 0 && t < c_.vocab, "token id {} out of range [0, {})", t, c_.vocab);
    KVD_EXPECT(pos_ + static_cast<std::int64_t>(tokens.size()) <= c_.max_seq, "{} tokens at position {} exceed the model's context {}", tokens.size(),
               pos_, c_.max_seq);
  }

  /// keep_prefill: a fresh record of an n-token prefill (its K/V are appended chunk by chunk).
  void begin_snapshot(std::int64_t n, std::int64_t loaded) {
    KVD_EXPECT(loaded == 0, "keep_prefill: a prefix loaded from the remote tier is not recorded");
    *snap_ = {};
    snap_->tokens = n;
    snap_->dtype = kv_.config().dtype;
    snap_->chunk = chunk_;
    snap_->k.assign(static_cast<std::size_t>(c_.layers), {});
    snap_->v.assign(static_cast<std::size_t>(c_.layers), {});
  }

  /// keep_prefill: the warm-up queries and the last logits, and the record is done.
  void end_snapshot(std::int64_t n) {
    snap_->observed = observed_ > 0 ? n - obs_first_ : 0;
    snap_->obs_q = obs_q_;
    snap_->logits = logits_;
    snap_ = nullptr;
  }

  /// tune_pipeline: calibrates the pipeline on this step's layer (then decodes with it).
  void calibrate_pipeline(int l, std::span<const SeqId> batch) {
    if constexpr (requires { kv_.tune(l, batch, fwd_.q_view(), fwd_.k_view(), fwd_.v_view(), fwd_.att_view()); }) {
      tune_ = false;
      tuned_ = kv_.tune(l, batch, fwd_.q_view(), fwd_.k_view(), fwd_.v_view(), fwd_.att_view()).micro_batch;
    }
  }

  /// Loads what it can of the prompt from the remote tier; returns the tokens loaded. It leaves
  /// the last token (its logits) and the warm-up observation positions (their queries) to compute,
  /// and loads nothing while recording a trace (its Q would be missing).
  std::int64_t load_shared_prefix(std::int64_t n) {
    if constexpr (requires { kv_.load_prefix(seq_, n, chunk_); }) {
      if (trace_ != nullptr || snap_ != nullptr || keep_all_logits_) return 0;  // their Q, K/V or logits would be missing
      const auto t0 = Clock::now();
      const int kvh = c_.kv_heads;
      const auto r = kv_.load_prefix(seq_, std::min(n - 1, obs_first_), chunk_, [&](int l, View<const float, 3> k, View<const float, 3> v) {
        for (int h = 0; h < kvh; ++h)
          for (std::int64_t t = 0; t < k.extent(0); ++t) prompt_kv_.append(static_cast<std::size_t>(l) * kvh + h, &k(t, h, 0), &v(t, h, 0));
      });
      times_.prefix_load_ms += ms_since(t0);
      times_.prefix_loaded_tokens += r.tokens;
      return r.tokens;
    } else {
      (void)n;
      return 0;
    }
  }

  /// The chunk tokens at positions [p0, p0 + n): every layer with causal attention over the
  /// prompt so far, its K/V into the manager; the logits after the last (and, teacher-forcing,
  /// after every) token.
  void prefill_chunk(std::span<const int> tokens, std::int64_t p0) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    fwd_.embed(tokens);
    fwd_.layers([p0](std::size_t i) { return p0 + static_cast<std::int64_t>(i); },
                [&](int l) {
                  keep_queries(l, p0, n);
                  keep_prompt_kv(l, n);
                  const auto ta = Clock::now();
                  causal(l, p0, n);
                  times_.prefill_attention_ms += ms_since(ta);
                  kv_.prefill(seq_, l, fwd_.k_view(), fwd_.v_view());
                  if (snap_ != nullptr) snapshot_kv(l, n);
                });
    if (keep_all_logits_)
      for (std::int64_t i = 0; i + 1 < n; ++i) {
        fwd_.logits(static_cast<std::size_t>(i), logits_.data());
        all_logits_.push_back(logits_);
      }
    fwd_.logits(static_cast<std::size_t>(n - 1), logits_.data());
    if (keep_all_logits_) all_logits_.push_back(logits_);
    times_.linear_ms += fwd_.take_linear_ms();
  }

  /// The chunk's Q, K and V of layer l to the trace, and its warm-up observation queries.
  void keep_queries(int l, std::int64_t p0, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto r = static_cast<std::size_t>(i);
      if (trace_) trace_->write(l, p0 + i, fwd_.q(r), fwd_.k(r), fwd_.v(r));
      if (!obs_q_.empty() && p0 + i >= obs_first_) {
        auto& oq = obs_q_[static_cast<std::size_t>(l)];
        oq.insert(oq.end(), fwd_.q(r), fwd_.q(r) + c_.dim);
      }
    }
  }

  /// The chunk's K/V of layer l appended to the prompt so far (PromptKv: per KV head, in the KV
  /// dtype, as the cache stores them).
  void keep_prompt_kv(int l, std::int64_t n) {
    const int kvh = c_.kv_heads, d = c_.head_dim();
    for (int h = 0; h < kvh; ++h)
      for (std::int64_t i = 0; i < n; ++i)
        prompt_kv_.append(static_cast<std::size_t>(l) * kvh + h, fwd_.k(static_cast<std::size_t>(i)) + h * d,
                          fwd_.v(static_cast<std::size_t>(i)) + h * d);
  }

  /// att = the chunk's causal attention over the prompt so far (layer l).
  void causal(int l, std::int64_t p0, std::int64_t n) {
    prompt_kv_.visit([&](const auto& rows) {
      CausalAttentionArgs<typename std::decay_t<decltype(rows)>::Element> ca;
      ca.q = fwd_.q(0);
      ca.out = fwd_.att(0);
      ca.keys = rows.k;
      ca.values = rows.v;
      ca.stream_stride = rows.stream_stride;
      ca.head_offset = static_cast<std::size_t>(l) * c_.kv_heads;
      ca.p0 = p0;
      ca.tokens = n;
      ca.heads = c_.heads;
      ca.kv_heads = c_.kv_heads;
      ca.head_dim = c_.head_dim();
      ca.scale = kv_.config().scale();
      causal_attention(pool_, ca);
    });
  }

  /// keep_prefill: the chunk's K/V of layer l appended to the record.
  void snapshot_kv(int l, std::int64_t n) {
    const auto values = static_cast<std::size_t>(n) * static_cast<std::size_t>(c_.kv_dim());
    auto& sk = snap_->k[static_cast<std::size_t>(l)];
    auto& sv = snap_->v[static_cast<std::size_t>(l)];
    sk.insert(sk.end(), fwd_.k(0), fwd_.k(0) + values);
    sv.insert(sv.end(), fwd_.v(0), fwd_.v(0) + values);
  }

  const LlamaConfig& c_;
  Manager& kv_;
  ThreadPool& pool_;
  Forward<Linear> fwd_;
  int chunk_;
  SeqId seq_ = 0;
  std::int64_t pos_ = 0;
  DecoderTimes times_;
  eval::TraceWriter* trace_ = nullptr;
  std::vector<float> logits_;
  PromptKv prompt_kv_;          ///< the prompt's K/V per (layer, KV head) while prefilling
  int observed_ = 0;            ///< warm-up observation queries (0: none)
  bool tune_ = false;           ///< tune the pipeline at the next step
  bool tune_clusters_ = false;  ///< tune the index's cluster size after prefill
  index::ClusterSizeChoice cluster_choice_;
  std::size_t tuned_ = 0;
  std::int64_t obs_first_ = 0;             ///< first prompt position whose queries are kept
  std::vector<std::vector<float>> obs_q_;  ///< [layer]: [observed][heads][head_dim] while prefilling
  PrefillSnapshot* snap_ = nullptr;        ///< the next prefill records into it (keep_prefill)
  bool keep_all_logits_ = false;           ///< teacher_force: logits at every position
  std::vector<std::vector<float>> all_logits_;
};

}  // namespace kvdrive::llama
