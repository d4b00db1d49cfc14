// Loader for llama2.c checkpoints (the legacy run.c layout): a header of 7 int32 (dim,
// hidden_dim, layers, heads, kv_heads, vocab, max_seq; a negative vocab means the classifier is
// not shared), then float32 tensors in a fixed order. The file is mapped; weights are used in
// place. RoPE rotates interleaved pairs (2i, 2i+1), theta 10000.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "kvdrive/core/error.hpp"
#include "model/mapped_file.hpp"
#include "model/model.hpp"

namespace kvdrive::llama {

namespace llama2c_detail {

inline constexpr std::size_t kHeader = 7 * sizeof(std::int32_t);

/// The hyper-parameters of the checkpoint's header, each checked for a plausible size.
inline LlamaConfig read_header(const MappedFile& file, const std::string& path) {
  KVD_EXPECT(file.size() >= kHeader, "{}: {} bytes is shorter than the 28-byte llama2.c header", path, file.size());
  std::int32_t h[7];
  std::memcpy(h, file.data(), kHeader);
  const char* names[] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    const std::int64_t v = i == 5 ? (h[i] < 0 ? -static_cast<std::int64_t>(h[i]) : h[i]) : h[i];
    KVD_EXPECT(v > 0, "{}: header field {} is {}, expected > 0", path, names[i], h[i]);
    KVD_EXPECT(v <= (i == 5 ? (1 << 24) : (1 << 20)), "{}: header field {} is {}, implausibly large", path, names[i], h[i]);
  }
  LlamaConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.layers = h[2];
  c.heads = h[3];
  c.kv_heads = h[4];
  c.tied_embeddings = h[5] > 0;
  c.vocab = h[5] > 0 ? h[5] : -h[5];
  c.max_seq = h[6];
  c.rope_layout = RopeLayout::interleaved;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-5f;
  c.validate(path);
  return c;
}

/// The sizes as 64-bit counts: dim, hidden_dim, layers, vocab, kv_dim, max_seq, head_dim.
struct Sizes {
  std::uint64_t dim, hidden_dim, layers, vocab, kv_dim, max_seq, head_dim;
};
inline Sizes sizes(const LlamaConfig& c) {
  const auto u = [](int x) { return static_cast<std::uint64_t>(x); };
  return {u(c.dim), u(c.hidden_dim), u(c.layers), u(c.vocab), u(c.kv_dim()), u(c.max_seq), u(c.head_dim())};
}

/// The file size the header implies: the header and every float32 tensor, the RoPE tables included.
inline std::uint64_t expected_bytes(const LlamaConfig& c, const std::string& path) {
  const auto [D, H, L, V, KV, S, HD] = sizes(c);
  // Checked arithmetic: crafted headers must not wrap around to a size that matches.
  auto mul = [&](std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    KVD_EXPECT(!__builtin_mul_overflow(a, b, &r), "{}: the header's sizes overflow", path);
    return r;
  };
  auto add = [&](std::initializer_list<std::uint64_t> terms) {
    std::uint64_t r = 0;
    for (std::uint64_t t : terms) KVD_EXPECT(!__builtin_add_overflow(r, t, &r), "{}: the header's sizes overflow", path);
    return r;
  };
  const std::uint64_t floats = add({mul(V, D), mul(L, D), mul(mul(L, D), D), mul(mul(mul(2, L), KV), D), mul(mul(L, D), D), mul(L, D),
                                    mul(mul(mul(3, L), H), D), D, mul(S, HD), c.tied_embeddings ? 0 : mul(V, D)});
  return add({kHeader, mul(floats, sizeof(float))});
}

}  // namespace llama2c_detail

inline Model load_llama2c(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  Model m;
  m.source = path;
  m.config = llama2c_detail::read_header(*file, path);
  const LlamaConfig& c = m.config;
  const std::uint64_t expect = llama2c_detail::expected_bytes(c, path);
  KVD_EXPECT(file->size() >= expect, "{}: the file has {} bytes but its header implies {} (truncated?)", path, file->size(), expect);
  KVD_EXPECT(file->size() == expect, "{}: the file has {} bytes but its header implies {} (not a llama2.c checkpoint?)", path, file->size(), expect);

  const auto [D, H, L, V, KV, S, HD] = llama2c_detail::sizes(c);
  const float* p = reinterpret_cast<const float*>(file->data() + llama2c_detail::kHeader);
  auto take = [&](std::uint64_t n) {
    const float* t = p;
    p += n;
    return t;
  };
  const auto matrix = [&](std::uint64_t rows, std::uint64_t cols) {
    return Matrix::f32(take(rows * cols), static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols));
  };
  m.token_embedding = matrix(V, D);
  m.layers.resize(static_cast<std::size_t>(L));
  for (auto& l : m.layers) l.rms_att = take(D);
  for (auto& l : m.layers) l.wq = matrix(D, D);
  for (auto& l : m.layers) l.wk = matrix(KV, D);
  for (auto& l : m.layers) l.wv = matrix(KV, D);
  for (auto& l : m.layers) l.wo = matrix(D, D);
  for (auto& l : m.layers) l.rms_ffn = take(D);
  for (auto& l : m.layers) l.w1 = matrix(H, D);
  for (auto& l : m.layers) l.w2 = matrix(D, H);
  for (auto& l : m.layers) l.w3 = matrix(H, D);
  m.rms_final = take(D);
  take(S * HD / 2);  // freq_cis_real: recomputed, not read
  take(S * HD / 2);  // freq_cis_imag
  m.classifier = c.tied_embeddings ? m.token_embedding : matrix(V, D);
  m.weight_types = "F32";
  m.file = std::move(file);
  return m;
}

}  // namespace kvdrive::llama
