// Forward: the Llama forward pass over n rows at once (RMSNorm, Q/K/V projections, RoPE, the
// attention's output projection, SwiGLU FFN, final norm and logits), with the attention itself
// left to the caller. Decoder runs it over a prefill chunk (n tokens of one sequence) and over a
// decode step (n = 1), BatchDecoder over a decode step of one row per sequence.
//
// One row's projections are matrix-vector products, n rows' a matrix product; with CpuLinear a
// matrix product's row equals the matrix-vector product of its input bit for bit (linear.hpp),
// and every other operation here works row by row, so a row's result does not depend on the rows
// beside it.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/core/view.hpp"
#include "kernels/linear.hpp"
#include "model/model.hpp"
#include "kernels/rope.hpp"

namespace kvdrive::llama {

/// x / sqrt(mean(x^2) + eps) * w, for one row of n values.
inline void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (inv * x[i]);
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

/// The forward pass over the rows of one call: embed(tokens), then layers(position, attend),
/// then logits(row, out) for the rows whose logits are wanted. Linear: where the projections, FFN
/// and logits run (CpuLinear, or CublasLinear on a GPU), constructed from the thread pool.
template <class Linear>
class Forward {
 public:
  Forward(const Model& model, ThreadPool& pool)
      : m_(model), c_(model.config), lin_(pool), rope_(c_.head_dim(), c_.rope_theta, c_.rope_layout, c_.rope_scaling, c_.rope_freq_factors) {}
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  /// Starts a pass over tokens.size() rows (at least one): their embeddings become the residual
  /// stream x.
  void embed(std::span<const int> tokens) {
    n_ = tokens.size();
    const auto dim = static_cast<std::size_t>(c_.dim);
    x_.resize(n_ * dim);
    for (std::size_t i = 0; i < n_; ++i) embed_row(m_.token_embedding, tokens[i], x_.data() + i * dim);
    xb_.resize(x_.size());
    q_.resize(x_.size());
    k_.resize(n_ * static_cast<std::size_t>(c_.kv_dim()));
    v_.resize(k_.size());
    att_.resize(x_.size());
  }

  /// Every layer over the rows: the attention norm, Q/K/V with RoPE at position(i) for row i,
  /// then attend(layer), which turns q, k and v into att, then x += att Wo^T and the FFN.
  template <class Position, class Attend>
  void layers(const Position& position, Attend&& attend) {
    for (int l = 0; l < c_.layers; ++l) {
      const LayerWeights& w = m_.layers[static_cast<std::size_t>(l)];
      qkv(w, position);
      attend(l);
      residual(w.wo, att_.data());
      ffn(w);
    }
  }

  /// out[vocab]: the logits after row `row` (the final norm, then the classifier).
  void logits(std::size_t row, float* out) {
    rmsnorm(xb_.data(), x_.data() + row * static_cast<std::size_t>(c_.dim), m_.rms_final, c_.dim, c_.rms_eps);
    linear([&] { lin_.matvec(m_.classifier, xb_.data(), out); });
  }

  /// Row i of this pass's Q [heads][head_dim], K and V [kv_heads][head_dim], after RoPE.
  float* q(std::size_t i) { return q_.data() + i * static_cast<std::size_t>(c_.dim); }
  float* k(std::size_t i) { return k_.data() + i * static_cast<std::size_t>(c_.kv_dim()); }
  float* v(std::size_t i) { return v_.data() + i * static_cast<std::size_t>(c_.kv_dim()); }
  /// Row i of the attention's output [heads][head_dim], which attend() writes.
  float* att(std::size_t i) { return att_.data() + i * static_cast<std::size_t>(c_.dim); }
  /// The pass's rows as [rows][heads][head_dim] (q, att) and [rows][kv_heads][head_dim] (k, v).
  View<float, 3> q_view() { return make_view(q_.data(), rows(), c_.heads, c_.head_dim()); }
  View<float, 3> k_view() { return make_view(k_.data(), rows(), c_.kv_heads, c_.head_dim()); }
  View<float, 3> v_view() { return make_view(v_.data(), rows(), c_.kv_heads, c_.head_dim()); }
  View<float, 3> att_view() { return make_view(att_.data(), rows(), c_.heads, c_.head_dim()); }
  std::int64_t rows() const { return static_cast<std::int64_t>(n_); }

  /// Wall time in the projections, FFN and logits so far, in milliseconds; take_linear_ms()
  /// returns it and starts again from 0.
  double linear_ms() const { return linear_ms_; }
  double take_linear_ms() { return std::exchange(linear_ms_, 0.0); }

 private:
  using Clock = std::chrono::steady_clock;

  template <class F>
  void linear(F&& f) {
    const auto t0 = Clock::now();
    f();
    linear_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

  /// out[n][rows of W] = in[n][cols of W] W^T.
  void product(const Matrix& w, const float* in, float* out) {
    if (n_ == 1) lin_.matvec(w, in, out);
    else lin_.matmul(w, in, out, n_);
  }

  /// xb = rmsnorm(x); q, k, v = xb Wq^T, xb Wk^T, xb Wv^T; RoPE on q and k.
  template <class Position>
  void qkv(const LayerWeights& w, const Position& position) {
    const auto dim = static_cast<std::size_t>(c_.dim);
    for (std::size_t i = 0; i < n_; ++i) rmsnorm(xb_.data() + i * dim, x_.data() + i * dim, w.rms_att, c_.dim, c_.rms_eps);
    linear([&] {
      product(w.wq, xb_.data(), q_.data());
      product(w.wk, xb_.data(), k_.data());
      product(w.wv, xb_.data(), v_.data());
    });
    for (std::size_t i = 0; i < n_; ++i) {
      const std::int64_t pos = position(i);
      rope_.rotate(q(i), c_.heads, pos);
      rope_.rotate(k(i), c_.kv_heads, pos);
    }
  }

  /// x[n][dim] += in[n][in_dim] W^T (W is [dim][in_dim]).
  void residual(const Matrix& w, const float* in) {
    tmp_.resize(n_ * static_cast<std::size_t>(c_.dim));
    linear([&] { product(w, in, tmp_.data()); });
    for (std::size_t i = 0; i < tmp_.size(); ++i) x_[i] += tmp_[i];
  }

  /// x[n][dim] += W2 (silu(W1 rmsnorm(x)) * W3 rmsnorm(x)), row by row.
  void ffn(const LayerWeights& w) {
    const auto dim = static_cast<std::size_t>(c_.dim);
    for (std::size_t i = 0; i < n_; ++i) rmsnorm(xb_.data() + i * dim, x_.data() + i * dim, w.rms_ffn, c_.dim, c_.rms_eps);
    h1_.resize(n_ * static_cast<std::size_t>(c_.hidden_dim));
    h3_.resize(h1_.size());
    linear([&] {
      product(w.w1, xb_.data(), h1_.data());
      product(w.w3, xb_.data(), h3_.data());
    });
    for (std::size_t i = 0; i < h1_.size(); ++i) h1_[i] = silu(h1_[i]) * h3_[i];
    residual(w.w2, h1_.data());
  }

  const Model& m_;
  const LlamaConfig& c_;
  Linear lin_;
  Rope rope_;
  std::size_t n_ = 0;  ///< rows of the pass
  std::vector<float> x_, xb_, q_, k_, v_, att_, tmp_, h1_, h3_;
  double linear_ms_ = 0;
};

}  // namespace kvdrive::llama
