// BatchDecoder: several sequences of one manager, each a Decoder (decoder_sequence.hpp), decoded
// together through the same forward pass over one row per sequence.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "decoder/decoder_sequence.hpp"
#include "decoder/forward.hpp"
#include "kernels/linear.hpp"
#include "model/model.hpp"

namespace kvdrive::llama {

/// Several sequences of one manager decoded together: each is a Decoder, prefilled on its own
/// (any lengths), and step() advances them all by one token with one KvManager::attend per layer
/// for the whole batch and the projections as matrix products over it (each weight read once
/// per step, not once per sequence). With CpuLinear, row i of a step's logits is bit for bit what
/// sequence i's own Decoder::step would give: the manager's output does not depend on the batch
/// (Decision 2), and the forward pass is Decoder's own, over a row per sequence (forward.hpp)
/// (cuBLAS's GEMM and GEMV do not promise that, and each decoder there holds its own copy of the
/// weights).
template <class Manager, class Linear = CpuLinear>
class BatchDecoder {
 public:
  BatchDecoder(const Model& model, Manager& kv, ThreadPool& pool, int prefill_chunk = 256)
      : m_(model), kv_(kv), pool_(pool), fwd_(model, pool), chunk_(prefill_chunk) {}

  /// A new sequence, with its own Decoder (prefill it, or prefill_from a snapshot, through it).
  Decoder<Manager, Linear>& add(std::optional<PrefixDigest> digest = std::nullopt) {
    seqs_.push_back(std::make_unique<Decoder<Manager, Linear>>(m_, kv_, pool_, chunk_, digest));
    return *seqs_.back();
  }
  std::size_t size() const { return seqs_.size(); }
  Decoder<Manager, Linear>& operator[](std::size_t i) { return *seqs_[i]; }

  /// Decodes tokens[i] for every sequence i at its next position; returns the logits
  /// [sequence][vocab] that follow.
  const std::vector<std::vector<float>>& step(std::span<const int> tokens) {
    check(tokens);
    const auto t0 = Clock::now();
    const std::size_t b = seqs_.size();
    ids_.resize(b);
    for (std::size_t i = 0; i < b; ++i) ids_[i] = seqs_[i]->sequence();
    fwd_.embed(tokens);
    fwd_.layers([&](std::size_t i) { return seqs_[i]->position(); },
                [&](int l) { kv_.attend(l, ids_, fwd_.q_view(), fwd_.k_view(), fwd_.v_view(), fwd_.att_view()); });
    logits_.resize(b);
    for (std::size_t i = 0; i < b; ++i) {
      logits_[i].resize(static_cast<std::size_t>(m_.config.vocab));
      fwd_.logits(i, logits_[i].data());
    }
    for (auto& s : seqs_) {
      ++s->pos_;
      ++s->times_.decode_tokens;
    }
    step_ms_ += Decoder<Manager, Linear>::ms_since(t0);
    ++steps_;
    return logits_;
  }

  /// Batch steps so far, their wall time and the part in the projections.
  std::int64_t steps() const { return steps_; }
  double step_ms() const { return step_ms_; }
  double linear_ms() const { return fwd_.linear_ms(); }

 private:
  using Clock = std::chrono::steady_clock;

  void check(std::span<const int> tokens) const {
    const std::size_t b = seqs_.size();
    KVD_EXPECT(b > 0 && tokens.size() == b, "batch step: {} tokens for {} sequences", tokens.size(), b);
    for (std::size_t i = 0; i < b; ++i) {
      KVD_EXPECT(seqs_[i]->position() > 0, "batch step: sequence {} has no prompt yet", i);
      seqs_[i]->check_tokens(tokens.subspan(i, 1));
    }
  }

  const Model& m_;
  Manager& kv_;
  ThreadPool& pool_;
  Forward<Linear> fwd_;
  int chunk_;
  std::vector<std::unique_ptr<Decoder<Manager, Linear>>> seqs_;
  std::vector<SeqId> ids_;
  std::vector<std::vector<float>> logits_;
  std::int64_t steps_ = 0;
  double step_ms_ = 0;
};

}  // namespace kvdrive::llama
