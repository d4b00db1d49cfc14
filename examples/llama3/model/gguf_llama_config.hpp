// The hyper-parameters of a llama GGUF file (gguf.hpp) from its `llama.*` metadata: sizes, RoPE
// (base, linear scaling, rope_freqs.weight's per-frequency divisors) and the norm epsilon. What
// this decoder does not compute (another architecture, mixture-of-experts, sliding-window
// attention, a head size apart from embedding_length / head_count, RoPE scaling other than
// linear) is refused with a message saying so. gguf_loader.hpp reads the weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "model/model.hpp"

namespace kvdrive::llama {

namespace gguf_loader_detail {

/// A float vector tensor's values (F32, F16 or BF16), converted to float.
inline std::vector<float> floats(const GgufFile& f, const GgufTensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.elements));
  switch (t.type) {
    case GgmlType::F32: std::memcpy(out.data(), t.data, t.bytes); break;
    case GgmlType::F16:
    case GgmlType::BF16:
      for (std::size_t i = 0; i < out.size(); ++i) {
        std::uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        out[i] = t.type == GgmlType::F16 ? half_bits_to_float(b) : bf16_bits_to_float(b);
      }
      break;
    default:
      fail("{}: tensor '{}' is {}; float vectors (norm weights, rope_freqs) must be F32, F16 or BF16", f.path(), gguf_printable(t.name),
           ggml_type_name(t.type));
  }
  return out;
}

/// Whether dims equal want, ignoring trailing 1s.
inline bool same_shape(const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& want) {
  const std::size_t n = std::max(dims.size(), want.size());
  for (std::size_t i = 0; i < n; ++i)
    if ((i < dims.size() ? dims[i] : 1) != (i < want.size() ? want[i] : 1)) return false;
  return true;
}

/// A file's `llama.*` metadata, read with the checks each hyper-parameter gets.
struct LlamaKeys {
  const GgufFile& f;
  const std::string& p;  ///< the file's path, for messages
  std::string a;         ///< the key prefix: the architecture and a dot

  /// A size in 1..2^30: the key's value, else the fallback (none: the key must be there).
  int size(const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) const {
    std::optional<std::int64_t> v = f.get_int(key);
    if (!v) {
      KVD_EXPECT(fallback.has_value(), "{}: metadata '{}' is missing (a llama model needs it)", p, key);
      v = fallback;
    }
    KVD_EXPECT(*v >= 1 && *v <= (std::int64_t{1} << 30), "{}: '{}' is {}, expected 1..2^30", p, key, *v);
    return static_cast<int>(*v);
  }
  /// A positive number: the key's value, else the fallback.
  double positive(const std::string& key, double fallback) const {
    const double v = f.get_float(key).value_or(fallback);
    KVD_EXPECT(std::isfinite(v) && v > 0, "{}: '{}' is {}, expected a positive number", p, key, v);
    return v;
  }
};

/// The vocabulary size: llama.vocab_size, else the count of tokenizer.ggml.tokens, else the rows
/// of token_embd.weight.
inline int vocab_size(const LlamaKeys& k) {
  const GgufFile& f = k.f;
  const std::string& p = k.p;
  if (f.has(k.a + "vocab_size")) return k.size(k.a + "vocab_size");
  if (const GgufValue* t = f.find("tokenizer.ggml.tokens"); t != nullptr && t->is_array()) {
    KVD_EXPECT(t->length >= 1 && t->length <= (std::uint64_t{1} << 30), "{}: tokenizer.ggml.tokens has {} entries, expected 1..2^30", p, t->length);
    return static_cast<int>(t->length);
  }
  if (const GgufTensor* e = f.find_tensor("token_embd.weight"); e != nullptr && e->dims.size() >= 2) {
    KVD_EXPECT(e->dims[1] <= (std::int64_t{1} << 30), "{}: token_embd.weight has {} rows, expected 1..2^30", p, e->dims[1]);
    return static_cast<int>(e->dims[1]);
  }
  fail("{}: no {}vocab_size, tokenizer.ggml.tokens or token_embd.weight to give the vocabulary size", p, k.a);
}

/// The head size is embedding_length / head_count; metadata giving another one is refused.
inline void check_head_dim(const LlamaKeys& k, const LlamaConfig& c) {
  const int hd = c.head_dim();
  KVD_EXPECT(hd <= 65536, "{}: head_dim (embedding_length {} / head_count {}) is {}, expected at most 65536", k.p, c.dim, c.heads, hd);
  for (const char* key : {"rope.dimension_count", "attention.key_length", "attention.value_length"})
    if (const auto v = k.f.get_int(k.a + key); v && *v != hd)
      fail("{}: '{}{}' is {} but head_dim (embedding_length / head_count) is {}: not supported", k.p, k.a, key, *v, hd);
}

/// The linear RoPE scaling factor (a type of "linear", or none given, with a factor); 0 for none.
inline double linear_rope_factor(const LlamaKeys& k) {
  const GgufFile& f = k.f;
  const std::string& a = k.a;
  const std::string scaling = f.get_string(a + "rope.scaling.type").value_or("");
  double linear = 0.0;
  if (scaling != "none") {
    KVD_EXPECT(scaling.empty() || scaling == "linear",
               "{}: RoPE scaling type '{}' ({}rope.scaling.type) is not supported; only linear scaling and rope_freqs.weight are", k.p,
               gguf_printable(scaling), a);
    const std::optional<double> factor =
        f.has(a + "rope.scaling.factor") ? f.get_float(a + "rope.scaling.factor") : f.get_float(a + "rope.scale_linear");
    if (factor && *factor != 0.0) {
      KVD_EXPECT(std::isfinite(*factor) && *factor > 0, "{}: the linear RoPE scaling factor is {}, expected a positive number", k.p, *factor);
      if (*factor != 1.0) linear = *factor;
    }
  }
  return linear;
}

/// The RoPE frequency divisors: rope_freqs.weight's, each times the linear factor, or the linear
/// factor for every frequency; none (empty) without either.
inline std::vector<float> rope_freq_factors(const LlamaKeys& k, int head_dim, double linear) {
  const std::string& p = k.p;
  const std::size_t pairs = static_cast<std::size_t>(head_dim / 2);
  std::vector<float> factors;
  if (const GgufTensor* t = k.f.find_tensor("rope_freqs.weight")) {
    KVD_EXPECT(same_shape(t->dims, {static_cast<std::int64_t>(pairs)}), "{}: tensor 'rope_freqs.weight' has shape {}, expected [{}] (head_dim / 2)",
               p, t->shape(), pairs);
    factors = floats(k.f, *t);
    for (std::size_t i = 0; i < pairs; ++i) {
      const float x = factors[i];
      KVD_EXPECT(std::isfinite(x) && x > 0, "{}: rope_freqs.weight[{}] is {}, expected a positive number", p, i, x);
      if (linear != 0.0) factors[i] = gguf_to_float(x * linear);
      KVD_EXPECT(std::isfinite(factors[i]) && factors[i] > 0,
                 "{}: rope_freqs.weight[{}] {} times the linear RoPE factor {} is outside the range of float", p, i, x, linear);
    }
  } else if (linear != 0.0) {
    factors.assign(pairs, gguf_to_float(linear));
    KVD_EXPECT(std::isfinite(factors[0]) && factors[0] > 0, "{}: the linear RoPE scaling factor {} is outside the range of float", p, linear);
  }
  return factors;
}

}  // namespace gguf_loader_detail

/// The hyper-parameters of a llama GGUF file.
inline LlamaConfig gguf_llama_config(const GgufFile& f) {
  const std::string& p = f.path();
  const std::optional<std::string> arch = f.get_string("general.architecture");
  KVD_EXPECT(arch.has_value(), "{}: no general.architecture: not a model file?", p);
  KVD_EXPECT(*arch == "llama", "{}: general.architecture is '{}'; only llama is supported", p, gguf_printable(*arch));
  const gguf_loader_detail::LlamaKeys k{f, p, *arch + "."};
  const std::string& a = k.a;

  // What this decoder does not do: refuse it rather than compute something else.
  if (const auto e = f.get_int(a + "expert_count"); e && *e > 0)
    fail("{}: '{}expert_count' is {}: mixture-of-experts llama models are not supported", p, a, *e);
  if (f.has(a + "attention.sliding_window")) fail("{}: '{}attention.sliding_window' is present: sliding-window attention is not supported", p, a);

  LlamaConfig c;
  c.dim = k.size(a + "embedding_length");
  c.hidden_dim = k.size(a + "feed_forward_length");
  c.layers = k.size(a + "block_count");
  c.heads = k.size(a + "attention.head_count");
  c.kv_heads = k.size(a + "attention.head_count_kv", c.heads);
  c.max_seq = k.size(a + "context_length");
  c.rope_theta = k.positive(a + "rope.freq_base", 10000.0);
  c.rms_eps = gguf_to_float(k.positive(a + "attention.layer_norm_rms_epsilon", 1e-5));
  KVD_EXPECT(std::isfinite(c.rms_eps) && c.rms_eps > 0, "{}: '{}attention.layer_norm_rms_epsilon' is {}, outside the range of float", p, a,
             f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(0));
  c.rope_layout = RopeLayout::interleaved;
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.vocab = gguf_loader_detail::vocab_size(k);
  c.validate(p);

  gguf_loader_detail::check_head_dim(k, c);
  // RoPE scaling: linear (a type of "linear", or none given, with a factor) divides every
  // frequency by the factor; rope_freqs.weight gives a divisor per frequency. Both multiply.
  const double linear = gguf_loader_detail::linear_rope_factor(k);
  c.rope_freq_factors = gguf_loader_detail::rope_freq_factors(k, c.head_dim(), linear);
  c.validate(p);
  return c;
}

}  // namespace kvdrive::llama
