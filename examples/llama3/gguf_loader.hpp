// Llama models from GGUF files (gguf.hpp): the hyper-parameters from the `llama.*` metadata, the
// tokenizer's description from `tokenizer.*` (GgufVocab), and the weights used in place in the
// mapped file, in their GGUF blocks (Matrix). Only the llama architecture is read (Llama 1-3,
// SmolLM2, TinyLlama, ...); any other, mixture-of-experts, sliding-window attention, partial
// RoPE or YaRN scaling is refused with a message saying so.
//
// GGUF stores a matrix's dims as [ne0 = cols (inputs), ne1 = rows (outputs)], and llama's Q/K rows
// permuted for RoPE on adjacent pairs (the converter's job), so RopeLayout::interleaved. A file
// without output.weight ties the classifier to the token embedding. rope_freqs.weight (Llama 3.1
// and later) gives per-frequency RoPE divisors; linear RoPE scaling becomes the same divisors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gguf.hpp"
#include "gguf_vocab.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "model.hpp"

namespace kvdrive::llama {

/// The tokenizer metadata of a GGUF file (every `tokenizer.ggml.*` field GgufVocab has, and
/// `tokenizer.chat_template`); absent fields stay empty. Scores and token types, when present,
/// must have one entry per token; token ids must be in 0..2^31-1 (their range against the
/// vocabulary is the tokenizer's check).
inline GgufVocab read_vocab(const GgufFile& f) {
  const std::string& p = f.path();
  GgufVocab v;
  v.model = f.get_string("tokenizer.ggml.model").value_or("");
  v.pre = f.get_string("tokenizer.ggml.pre").value_or("");
  if (auto t = f.get_string_array("tokenizer.ggml.tokens")) v.tokens = std::move(*t);
  if (auto s = f.get_float_array("tokenizer.ggml.scores")) v.scores = std::move(*s);
  if (auto tt = f.get_int_array("tokenizer.ggml.token_type")) {
    v.token_types.reserve(tt->size());
    for (std::size_t i = 0; i < tt->size(); ++i) {
      const std::int64_t x = (*tt)[i];
      KVD_EXPECT(x >= std::numeric_limits<std::int32_t>::min() && x <= std::numeric_limits<std::int32_t>::max(),
                 "{}: tokenizer.ggml.token_type[{}] is {}, outside the int32 range", p, i, x);
      v.token_types.push_back(static_cast<std::int32_t>(x));
    }
  }
  if (auto m = f.get_string_array("tokenizer.ggml.merges")) v.merges = std::move(*m);
  KVD_EXPECT(v.scores.empty() || v.scores.size() == v.tokens.size(), "{}: tokenizer.ggml.scores has {} entries for {} tokens", p,
             v.scores.size(), v.tokens.size());
  KVD_EXPECT(v.token_types.empty() || v.token_types.size() == v.tokens.size(),
             "{}: tokenizer.ggml.token_type has {} entries for {} tokens", p, v.token_types.size(), v.tokens.size());
  const auto id = [&](const char* key) -> std::optional<std::int32_t> {
    const std::optional<std::int64_t> x = f.get_int(key);
    if (!x) return std::nullopt;
    KVD_EXPECT(*x >= 0 && *x <= std::numeric_limits<std::int32_t>::max(), "{}: {} is {}, expected a token id in 0..2^31-1", p, key,
               *x);
    return static_cast<std::int32_t>(*x);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.eot = id("tokenizer.ggml.eot_token_id");
  v.eom = id("tokenizer.ggml.eom_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.sep = id("tokenizer.ggml.seperator_token_id");  // sic: the key GGUF writers use
  if (!v.sep) v.sep = id("tokenizer.ggml.separator_token_id");
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  v.chat_template = f.get_string("tokenizer.chat_template").value_or("");
  return v;
}

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
      fail("{}: tensor '{}' is {}; float vectors (norm weights, rope_freqs) must be F32, F16 or BF16", f.path(),
           gguf_printable(t.name), ggml_type_name(t.type));
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

inline std::string computable_types() {
  std::string s;
  for (std::uint32_t id = 0; id < 64; ++id)
    if (const GgmlTypeTraits tr = ggml_type_traits(id); tr.name != nullptr && tr.computable) s += (s.empty() ? "" : ", ") + std::string(tr.name);
  return s;
}

}  // namespace gguf_loader_detail

/// The hyper-parameters of a llama GGUF file.
inline LlamaConfig gguf_llama_config(const GgufFile& f) {
  const std::string& p = f.path();
  const std::optional<std::string> arch = f.get_string("general.architecture");
  KVD_EXPECT(arch.has_value(), "{}: no general.architecture: not a model file?", p);
  KVD_EXPECT(*arch == "llama", "{}: general.architecture is '{}'; only llama is supported", p, gguf_printable(*arch));
  const std::string a = *arch + ".";
  const auto size = [&](const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) -> int {
    std::optional<std::int64_t> v = f.get_int(key);
    if (!v) {
      KVD_EXPECT(fallback.has_value(), "{}: metadata '{}' is missing (a llama model needs it)", p, key);
      v = fallback;
    }
    KVD_EXPECT(*v >= 1 && *v <= (std::int64_t{1} << 30), "{}: '{}' is {}, expected 1..2^30", p, key, *v);
    return static_cast<int>(*v);
  };
  const auto positive = [&](const std::string& key, double fallback) {
    const double v = f.get_float(key).value_or(fallback);
    KVD_EXPECT(std::isfinite(v) && v > 0, "{}: '{}' is {}, expected a positive number", p, key, v);
    return v;
  };

  // What this decoder does not do: refuse it rather than compute something else.
  if (const auto e = f.get_int(a + "expert_count"); e && *e > 0)
    fail("{}: '{}expert_count' is {}: mixture-of-experts llama models are not supported", p, a, *e);
  if (f.has(a + "attention.sliding_window"))
    fail("{}: '{}attention.sliding_window' is present: sliding-window attention is not supported", p, a);

  LlamaConfig c;
  c.dim = size(a + "embedding_length");
  c.hidden_dim = size(a + "feed_forward_length");
  c.layers = size(a + "block_count");
  c.heads = size(a + "attention.head_count");
  c.kv_heads = size(a + "attention.head_count_kv", c.heads);
  c.max_seq = size(a + "context_length");
  c.rope_theta = positive(a + "rope.freq_base", 10000.0);
  c.rms_eps = gguf_to_float(positive(a + "attention.layer_norm_rms_epsilon", 1e-5));
  KVD_EXPECT(std::isfinite(c.rms_eps) && c.rms_eps > 0, "{}: '{}attention.layer_norm_rms_epsilon' is {}, outside the range of float", p,
             a, f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(0));
  c.rope_layout = RopeLayout::interleaved;
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  if (f.has(a + "vocab_size")) {
    c.vocab = size(a + "vocab_size");
  } else if (const GgufValue* t = f.find("tokenizer.ggml.tokens"); t != nullptr && t->is_array()) {
    KVD_EXPECT(t->length >= 1 && t->length <= (std::uint64_t{1} << 30), "{}: tokenizer.ggml.tokens has {} entries, expected 1..2^30",
               p, t->length);
    c.vocab = static_cast<int>(t->length);
  } else if (const GgufTensor* e = f.find_tensor("token_embd.weight"); e != nullptr && e->dims.size() >= 2) {
    KVD_EXPECT(e->dims[1] <= (std::int64_t{1} << 30), "{}: token_embd.weight has {} rows, expected 1..2^30", p, e->dims[1]);
    c.vocab = static_cast<int>(e->dims[1]);
  } else {
    fail("{}: no {}vocab_size, tokenizer.ggml.tokens or token_embd.weight to give the vocabulary size", p, a);
  }
  c.validate(p);

  const int hd = c.head_dim();
  KVD_EXPECT(hd <= 65536, "{}: head_dim (embedding_length {} / head_count {}) is {}, expected at most 65536", p, c.dim, c.heads, hd);
  for (const char* k : {"rope.dimension_count", "attention.key_length", "attention.value_length"})
    if (const auto v = f.get_int(a + k); v && *v != hd)
      fail("{}: '{}{}' is {} but head_dim (embedding_length / head_count) is {}: not supported", p, a, k, *v, hd);

  // RoPE scaling: linear (a type of "linear", or none given, with a factor) divides every
  // frequency by the factor; rope_freqs.weight gives a divisor per frequency. Both multiply.
  const std::string scaling = f.get_string(a + "rope.scaling.type").value_or("");
  double linear = 0.0;
  if (scaling != "none") {
    KVD_EXPECT(scaling.empty() || scaling == "linear",
               "{}: RoPE scaling type '{}' ({}rope.scaling.type) is not supported; only linear scaling and rope_freqs.weight are", p,
               gguf_printable(scaling), a);
    const std::optional<double> factor = f.has(a + "rope.scaling.factor") ? f.get_float(a + "rope.scaling.factor")
                                                                          : f.get_float(a + "rope.scale_linear");
    if (factor && *factor != 0.0) {
      KVD_EXPECT(std::isfinite(*factor) && *factor > 0, "{}: the linear RoPE scaling factor is {}, expected a positive number", p,
                 *factor);
      if (*factor != 1.0) linear = *factor;
    }
  }
  const std::size_t pairs = static_cast<std::size_t>(hd / 2);
  if (const GgufTensor* t = f.find_tensor("rope_freqs.weight")) {
    KVD_EXPECT(gguf_loader_detail::same_shape(t->dims, {static_cast<std::int64_t>(pairs)}),
               "{}: tensor 'rope_freqs.weight' has shape {}, expected [{}] (head_dim / 2)", p, t->shape(), pairs);
    c.rope_freq_factors = gguf_loader_detail::floats(f, *t);
    for (std::size_t i = 0; i < pairs; ++i) {
      const float x = c.rope_freq_factors[i];
      KVD_EXPECT(std::isfinite(x) && x > 0, "{}: rope_freqs.weight[{}] is {}, expected a positive number", p, i, x);
      if (linear != 0.0) c.rope_freq_factors[i] = gguf_to_float(x * linear);
      KVD_EXPECT(std::isfinite(c.rope_freq_factors[i]) && c.rope_freq_factors[i] > 0,
                 "{}: rope_freqs.weight[{}] {} times the linear RoPE factor {} is outside the range of float",
                 p, i, x, linear);
    }
  } else if (linear != 0.0) {
    c.rope_freq_factors.assign(pairs, gguf_to_float(linear));
    KVD_EXPECT(std::isfinite(c.rope_freq_factors[0]) && c.rope_freq_factors[0] > 0,
               "{}: the linear RoPE scaling factor {} is outside the range of float", p, linear);
  }
  c.validate(p);
  return c;
}

/// A llama model from an open GGUF file; the model keeps the file's map alive (Model::file).
inline Model load_gguf(const GgufFile& f) {
  namespace d = gguf_loader_detail;
  const std::string& p = f.path();
  Model m;
  m.source = p;
  m.config = gguf_llama_config(f);
  const LlamaConfig& c = m.config;
  const std::vector<GgufTensor>& all = f.tensors();
  if (const auto n = f.get_int("split.count"); n && *n > 1)
    fail("{}: one of {} shards of a split GGUF (split.count); merge them into one file first (llama-gguf-split --merge)", p, *n);
  // 9 tensors a layer: a block count the tensors cannot back is refused before anything is sized by it.
  KVD_EXPECT(static_cast<std::uint64_t>(c.layers) <= all.size() / 9, "{}: llama.block_count is {}, but the file has only {} tensors (9 a layer)",
             p, c.layers, all.size());
  std::vector<bool> used(all.size(), false);
  std::map<std::string, int> type_counts;

  const auto get = [&](const std::string& name, const std::vector<std::int64_t>& shape) -> const GgufTensor& {
    const GgufTensor* t = f.find_tensor(name);
    KVD_EXPECT(t != nullptr, "{}: tensor '{}' is missing", p, name);
    KVD_EXPECT(d::same_shape(t->dims, shape), "{}: tensor '{}' has shape {} (ne0 first), the model's metadata implies [{}]", p, name,
               t->shape(), fmt::join(shape, ", "));
    const auto i = static_cast<std::size_t>(t - all.data());
    if (!used[i]) ++type_counts[ggml_type_name(t->type)];
    used[i] = true;
    return *t;
  };
  // The bytes of t at a 4-byte aligned address: in place, or copied when the file's alignment
  // left them misaligned (general.alignment 1 or 2).
  const auto aligned = [&](const GgufTensor& t) -> const std::byte* {
    if (reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0) return t.data;
    std::vector<float>& copy = m.owned.emplace_back((t.bytes + sizeof(float) - 1) / sizeof(float));
    std::memcpy(copy.data(), t.data, t.bytes);
    return reinterpret_cast<const std::byte*>(copy.data());
  };
  const auto matrix = [&](const std::string& name, int rows, int cols) -> Matrix {
    const GgufTensor& t = get(name, {cols, rows});
    KVD_EXPECT(ggml_type_traits(t.type).computable, "{}: tensor '{}' is {}, a type the decoder cannot compute with (it computes {})", p,
               name, ggml_type_name(t.type), d::computable_types());
    return {aligned(t), t.type, rows, cols};
  };
  const auto norm = [&](const std::string& name) -> const float* {
    const GgufTensor& t = get(name, {c.dim});
    if (t.type == GgmlType::F32) return reinterpret_cast<const float*>(aligned(t));
    KVD_EXPECT(t.type == GgmlType::F16 || t.type == GgmlType::BF16, "{}: tensor '{}' is {}; norm weights must be F32, F16 or BF16", p,
               name, ggml_type_name(t.type));
    return m.owned.emplace_back(d::floats(f, t)).data();
  };

  m.token_embedding = matrix("token_embd.weight", c.vocab, c.dim);
  m.layers.resize(static_cast<std::size_t>(c.layers));  // bounded by the tensors above
  for (int l = 0; l < c.layers; ++l) {
    LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
    const std::string b = fmt::format("blk.{}.", l);
    w.rms_att = norm(b + "attn_norm.weight");
    w.wq = matrix(b + "attn_q.weight", c.dim, c.dim);
    w.wk = matrix(b + "attn_k.weight", c.kv_dim(), c.dim);
    w.wv = matrix(b + "attn_v.weight", c.kv_dim(), c.dim);
    w.wo = matrix(b + "attn_output.weight", c.dim, c.dim);
    w.rms_ffn = norm(b + "ffn_norm.weight");
    w.w1 = matrix(b + "ffn_gate.weight", c.hidden_dim, c.dim);
    w.w2 = matrix(b + "ffn_down.weight", c.dim, c.hidden_dim);
    w.w3 = matrix(b + "ffn_up.weight", c.hidden_dim, c.dim);
  }
  m.rms_final = norm("output_norm.weight");
  m.classifier = c.tied_embeddings ? m.token_embedding : matrix("output.weight", c.vocab, c.dim);
  if (!c.rope_freq_factors.empty() && f.find_tensor("rope_freqs.weight") != nullptr)
    get("rope_freqs.weight", {c.head_dim() / 2});  // read by gguf_llama_config; counted here
  for (std::size_t i = 0; i < all.size(); ++i)
    KVD_EXPECT(used[i], "{}: tensor '{}' is not part of a {}-layer llama model as this loader reads it (biases, experts and extra layers are not supported)",
               p, gguf_printable(all[i].name), c.layers);

  std::vector<std::pair<std::string, int>> types(type_counts.begin(), type_counts.end());
  std::stable_sort(types.begin(), types.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  for (const auto& [name, n] : types) m.weight_types += fmt::format("{}{} ({})", m.weight_types.empty() ? "" : ", ", name, n);
  m.vocab = std::make_shared<const GgufVocab>(read_vocab(f));  // the tokenizer and chat template the file carries
  m.file = f.file();
  return m;
}

/// A llama model from a GGUF file: the weights stay in the mapped file, in their blocks.
inline Model load_gguf(const std::string& path) {
  const GgufFile f(path);
  return load_gguf(f);
}

}  // namespace kvdrive::llama
