// Causal attention for a chunk of prompt tokens, on the CPU, blocked over query tiles: the
// queries of kCausalTile (16) consecutive tokens (x the GQA group) attend together over the keys
// before the tile, so each block of keys is loaded once per tile rather than once per query; the keys
// inside the tile (the causal diagonal) are attended per token, and the two partial results are
// merged by log-sum-exp. Tasks are (tile, KV head) pairs on the thread pool. The arithmetic is
// kvdrive's attention kernel (attention::sparse_decode) over 64-key blocks (kCausalKeyBlock).
// Keys and values are float or a KV cache's element type (half, bfloat16; PromptKv keeps them
// so), widened to float as the kernel loads them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "kvdrive/core/thread_pool.hpp"

namespace kvdrive::llama {

/// T: the element type of the keys and values (float, half or bfloat16).
template <class T = float>
struct CausalAttentionArgs {
  const float* q = nullptr;  ///< [tokens][heads][head_dim], the chunk's queries (after RoPE)
  float* out = nullptr;      ///< [tokens][heads][head_dim]
  /// The prompt so far, chunk included, per stream: stream s's [p0 + tokens][head_dim] keys start
  /// at keys + s * stream_stride, its values at values + s * stream_stride.
  const T* keys = nullptr;
  const T* values = nullptr;
  std::size_t stream_stride = 0;
  std::size_t head_offset = 0;  ///< the stream of KV head 0 (layer x kv_heads)
  std::int64_t p0 = 0;          ///< position of the chunk's first token
  std::int64_t tokens = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};

/// FLOPs of causal attention for a chunk (two matrix products: scores and values).
inline double causal_attention_flops(std::int64_t p0, std::int64_t tokens, int heads, int head_dim) {
  const double keys = static_cast<double>(tokens) * static_cast<double>(p0) + static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2;
  return 4.0 * keys * heads * head_dim;
}

namespace detail {

inline constexpr std::int64_t kCausalTile = 16, kCausalKeyBlock = 64;

/// `rows` query rows of head_dim d attending over `pages` (elements of type T) with kvdrive's
/// decode kernel: their outputs and log-sum-exps.
template <class T>
void attend_pages(const float* q, int rows, int d, float scale, std::span<const attention::PageRef> pages, float* out, float* lse) {
  attention::DecodeArgs da;
  da.q = q;
  da.group = rows;
  da.head_dim = d;
  da.scale = scale;
  da.pages = pages;
  da.out = out;
  da.lse = lse;
  attention::sparse_decode<T>(da);
}

/// dst[d] = two partial attentions over disjoint keys merged: outputs pa and pb with the
/// log-sum-exps la and lb.
inline void merge_by_lse(const float* pa, float la, const float* pb, float lb, int d, float* dst) {
  const float mx = std::max(la, lb);
  const float wa = attention::exp_shifted(la - mx), wb = attention::exp_shifted(lb - mx);
  const float inv = 1.0f / (wa + wb);
  for (int e = 0; e < d; ++e) dst[e] = (wa * pa[e] + wb * pb[e]) * inv;
}

/// One task of causal_attention: the queries of tile `tile` in KV head h's group over the keys
/// before the tile, then each over the tile's keys up to itself, the two merged.
template <class T>
void causal_tile(const CausalAttentionArgs<T>& a, std::int64_t tile, int h) {
  const int g = a.heads / a.kv_heads, d = a.head_dim;
  const auto row = static_cast<std::size_t>(a.heads) * d;  // floats per token in q and out
  const std::int64_t t0 = tile * kCausalTile, n = std::min(kCausalTile, a.tokens - t0);
  const std::size_t stream = (a.head_offset + static_cast<std::size_t>(h)) * a.stream_stride;
  const T* k = a.keys + stream;
  const T* v = a.values + stream;
  const std::int64_t prefix = a.p0 + t0;  // keys every query of the tile sees in full

  thread_local std::vector<float> qt, out_a, lse_a, out_b, lse_b;
  thread_local std::vector<attention::PageRef> blocks;
  const auto rows = static_cast<std::size_t>(n) * g;
  qt.resize(rows * d);
  for (std::int64_t i = 0; i < n; ++i)  // the tile's queries of this KV head's group, contiguous
    std::copy_n(a.q + static_cast<std::size_t>(t0 + i) * row + static_cast<std::size_t>(h) * g * d, static_cast<std::size_t>(g) * d,
                qt.data() + static_cast<std::size_t>(i) * g * d);
  out_a.assign(rows * d, 0.0f);
  lse_a.assign(rows, -INFINITY);
  if (prefix > 0) {
    blocks.clear();
    for (std::int64_t b = 0; b < prefix; b += kCausalKeyBlock)
      blocks.push_back({k + b * d, v + b * d, static_cast<int>(std::min(kCausalKeyBlock, prefix - b))});
    attend_pages<T>(qt.data(), static_cast<int>(rows), d, a.scale, blocks, out_a.data(), lse_a.data());
  }
  out_b.resize(static_cast<std::size_t>(g) * d);
  lse_b.resize(static_cast<std::size_t>(g));
  for (std::int64_t i = 0; i < n; ++i) {
    // The diagonal: token i of the tile sees the tile's keys up to itself.
    const attention::PageRef diag{k + prefix * d, v + prefix * d, static_cast<int>(i + 1)};
    attend_pages<T>(qt.data() + static_cast<std::size_t>(i) * g * d, g, d, a.scale, std::span<const attention::PageRef>(&diag, 1), out_b.data(),
                    lse_b.data());
    for (int j = 0; j < g; ++j) {
      const std::size_t r = static_cast<std::size_t>(i) * g + j;
      merge_by_lse(out_a.data() + r * d, lse_a[r], out_b.data() + static_cast<std::size_t>(j) * d, lse_b[static_cast<std::size_t>(j)], d,
                   a.out + static_cast<std::size_t>(t0 + i) * row + (static_cast<std::size_t>(h) * g + j) * d);
    }
  }
}

}  // namespace detail

/// a.out = the chunk's causal attention over the prompt so far; tasks are (tile, KV head) pairs
/// on `pool`.
template <class T>
void causal_attention(ThreadPool& pool, const CausalAttentionArgs<T>& a) {
  const std::int64_t tiles = (a.tokens + detail::kCausalTile - 1) / detail::kCausalTile;
  pool.parallel_for(static_cast<std::size_t>(tiles * a.kv_heads), [&](std::size_t task) {
    detail::causal_tile(a, static_cast<std::int64_t>(task) / a.kv_heads, static_cast<int>(static_cast<std::int64_t>(task) % a.kv_heads));
  });
}

/// The prompt's keys and values while it is prefilled, per stream (layer * kv_heads + KV head),
/// each contiguous [tokens][head_dim] for causal_attention, in the KV cache's element type: the
/// values the cache stores (so that the prompt is attended as the cache will be, and a prefix
/// read back from a remote tier exactly as a computed one), in half the memory of float with an
/// f16 or bf16 cache. One block for K and one for V, sized for the whole prompt when it starts
/// (no growth by doubling) and freed by clear(): a long prompt's blocks are mappings of their own
/// (glibc maps every allocation of 32 MiB or more), so their memory goes back to the system
/// before decoding.
class PromptKv {
 public:
  /// What causal_attention reads: stream s's rows start at k + s * stream_stride (and v's).
  template <class T>
  struct Rows {
    using Element = T;
    const T *k = nullptr, *v = nullptr;
    std::size_t stream_stride = 0;
  };

  /// Starts a prompt of `tokens` tokens over `streams` streams of head_dim d, in `dtype`.
  void start(DType dtype, std::size_t streams, int d, std::int64_t tokens) {
    clear();
    dtype_ = dtype;
    d_ = static_cast<std::size_t>(d);
    stride_ = static_cast<std::size_t>(tokens) * d_;
    const std::size_t bytes = streams * stride_ * dtype_size(dtype);
    k_.reset(new std::byte[bytes]), v_.reset(new std::byte[bytes]);  // not touched until written
    rows_.assign(streams, 0);
  }
  /// Appends one token's key and value (head_dim floats each, rounded to the element type) to
  /// stream s.
  void append(std::size_t s, const float* k, const float* v) {
    KVD_EXPECT(s < rows_.size() && static_cast<std::size_t>(rows_[s] + 1) * d_ <= stride_, "PromptKv: stream {} is full ({} rows)", s,
               s < rows_.size() ? rows_[s] : 0);
    dispatch_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const std::size_t at = s * stride_ + static_cast<std::size_t>(rows_[s]) * d_;
      T* kd = reinterpret_cast<T*>(k_.get()) + at;
      T* vd = reinterpret_cast<T*>(v_.get()) + at;
      for (std::size_t j = 0; j < d_; ++j) kd[j] = from_float<T>(k[j]);
      for (std::size_t j = 0; j < d_; ++j) vd[j] = from_float<T>(v[j]);
    });
    ++rows_[s];
  }
  /// Frees both blocks.
  void clear() {
    k_.reset(), v_.reset();
    rows_.clear();
  }
  /// Calls f(Rows<T>{...}) with T the prompt's element type.
  template <class F>
  void visit(F&& f) const {
    dispatch_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      f(Rows<T>{reinterpret_cast<const T*>(k_.get()), reinterpret_cast<const T*>(v_.get()), stride_});
    });
  }
  /// Bytes the two blocks take (0 once cleared).
  std::size_t bytes() const { return k_ ? 2 * rows_.size() * stride_ * dtype_size(dtype_) : 0; }
  /// Rows appended to stream s so far.
  std::int64_t rows(std::size_t s) const { return rows_.at(s); }

 private:
  DType dtype_ = DType::f32;
  std::size_t d_ = 0, stride_ = 0;  ///< head_dim; elements per stream
  std::unique_ptr<std::byte[]> k_, v_;
  std::vector<std::int64_t> rows_;  ///< per stream
};

}  // namespace kvdrive::llama
