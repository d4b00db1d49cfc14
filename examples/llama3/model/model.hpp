// The Llama model the reference decoder runs: its hyper-parameters (LlamaConfig) and its weights
// (LayerWeights), which point either into a mapped file or into owned storage. Weight matrices
// are Matrix views (matrix.hpp): row-major [out][in], y = W x, in float or in GGUF blocks; norm
// weights are float.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/xxhash.hpp"
#include "tokenizer/gguf_vocab.hpp"
#include "model/mapped_file.hpp"
#include "kernels/matrix.hpp"

namespace kvdrive::llama {

/// How RoPE pairs the dimensions of a head: llama2.c rotates (2i, 2i+1); Hugging Face Llama
/// checkpoints rotate (i, i + d/2).
enum class RopeLayout { interleaved, half };

/// Llama-3 frequency scaling (rope_scaling.rope_type == "llama3"); factor 0 means none.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192;
};

struct LlamaConfig {
  int dim = 0;         ///< model width
  int hidden_dim = 0;  ///< FFN width
  int layers = 0;
  int heads = 0;  ///< query heads
  int kv_heads = 0;
  int vocab = 0;
  int max_seq = 0;  ///< trained context (max_position_embeddings)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::interleaved;
  /// Per-frequency divisors of RoPE (a GGUF file's rope_freqs.weight: Llama-3 scaling baked into
  /// head_dim / 2 factors); empty: none. Used instead of rope_scaling when present.
  std::vector<float> rope_freq_factors;
  float rms_eps = 1e-5f;
  bool tied_embeddings = true;  ///< the output head is the token embedding table

  int head_dim() const { return heads > 0 ? dim / heads : 0; }
  int kv_dim() const { return kv_heads * head_dim(); }

  void validate(const std::string& source) const {
    KVD_EXPECT(dim > 0 && hidden_dim > 0 && layers > 0 && heads > 0 && kv_heads > 0 && vocab > 0 && max_seq > 0,
               "{}: sizes must be positive (dim {}, hidden_dim {}, layers {}, heads {}, kv_heads {}, vocab {}, max_seq {})", source, dim, hidden_dim,
               layers, heads, kv_heads, vocab, max_seq);
    KVD_EXPECT(dim % heads == 0, "{}: dim {} is not a multiple of heads {}", source, dim, heads);
    KVD_EXPECT(heads % kv_heads == 0, "{}: heads {} is not a multiple of kv_heads {}", source, heads, kv_heads);
    KVD_EXPECT(head_dim() % 2 == 0, "{}: head_dim {} is odd; RoPE needs pairs", source, head_dim());
    KVD_EXPECT(rope_freq_factors.empty() || static_cast<int>(rope_freq_factors.size()) == head_dim() / 2,
               "{}: {} RoPE frequency factors, expected head_dim / 2 = {}", source, rope_freq_factors.size(), head_dim() / 2);
  }
};

struct LayerWeights {
  const float* rms_att = nullptr;  ///< [dim]
  Matrix wq;                       ///< [dim][dim]
  Matrix wk;                       ///< [kv_dim][dim]
  Matrix wv;                       ///< [kv_dim][dim]
  Matrix wo;                       ///< [dim][dim]
  const float* rms_ffn = nullptr;  ///< [dim]
  Matrix w1;                       ///< [hidden][dim] (gate)
  Matrix w2;                       ///< [dim][hidden] (down)
  Matrix w3;                       ///< [hidden][dim] (up)
};

struct Model {
  LlamaConfig config;
  std::string source;      ///< where it came from, for messages and summaries
  Matrix token_embedding;  ///< [vocab][dim]: a row per token
  std::vector<LayerWeights> layers;
  const float* rms_final = nullptr;  ///< [dim]
  Matrix classifier;                 ///< [vocab][dim]

  // Backing storage: mapped files and/or owned arrays.
  std::shared_ptr<MappedFile> file;
  std::vector<std::shared_ptr<MappedFile>> files;  ///< further mapped files (shards)
  std::vector<std::vector<float>> owned;
  std::shared_ptr<const GgufVocab> vocab;  ///< the tokenizer a GGUF file carries (nullptr for other formats)
  std::string weight_types;                ///< the weight formats, for summaries ("f32", "Q4_1 + Q8_0 + F32", ...)

  std::size_t parameters() const {
    const auto& c = config;
    const std::size_t per_layer = 2ull * c.dim + 2ull * c.dim * c.dim + 2ull * c.kv_dim() * c.dim + 3ull * c.hidden_dim * c.dim;
    return static_cast<std::size_t>(c.vocab) * c.dim * (c.tied_embeddings ? 1 : 2) + per_layer * c.layers + c.dim;
  }
};

/// The model/run digest of a remote tier's keys: the model's shape, RoPE and weights (all of
/// them, hashed once; about a second per 10 GB of weights).
inline PrefixDigest model_digest(const Model& m) {
  const LlamaConfig& c = m.config;
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  const auto add = [&](const float* p, std::size_t n) {
    if (p != nullptr) XXH3_128bits_update(st, p, n * sizeof(float));
  };
  const auto add_matrix = [&](const Matrix& w) {
    if (!w) return;
    const auto type = static_cast<std::uint32_t>(w.type);
    if (!w.is_f32()) XXH3_128bits_update(st, &type, sizeof type);  // float weights hash as they did before blocks
    XXH3_128bits_update(st, w.data, w.bytes());
  };
  const double shape[] = {double(c.layers),
                          double(c.dim),
                          double(c.heads),
                          double(c.kv_heads),
                          double(c.hidden_dim),
                          double(c.vocab),
                          double(c.rope_theta),
                          double(c.rms_eps),
                          double(static_cast<int>(c.rope_layout)),
                          c.rope_scaling.factor,
                          c.rope_scaling.low_freq_factor,
                          c.rope_scaling.high_freq_factor,
                          c.rope_scaling.original_max_position};
  XXH3_128bits_update(st, shape, sizeof shape);
  if (!c.rope_freq_factors.empty()) add(c.rope_freq_factors.data(), c.rope_freq_factors.size());
  const auto dim = static_cast<std::size_t>(c.dim);
  add_matrix(m.token_embedding);
  for (const LayerWeights& w : m.layers) {
    add(w.rms_att, dim), add_matrix(w.wq), add_matrix(w.wk), add_matrix(w.wv), add_matrix(w.wo);
    add(w.rms_ffn, dim), add_matrix(w.w1), add_matrix(w.w2), add_matrix(w.w3);
  }
  add(m.rms_final, dim);  // the classifier is not hashed: it does not shape the K/V
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return {h.low64, h.high64, 0};
}

}  // namespace kvdrive::llama
