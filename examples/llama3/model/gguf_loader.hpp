// Llama models from GGUF files (gguf.hpp): the hyper-parameters from the `llama.*` metadata
// (gguf_llama_config.hpp), the tokenizer's description from `tokenizer.*` (GgufVocab), and the
// weights used in place in the mapped file, in their GGUF blocks (Matrix). Only the llama
// architecture is read (Llama 1-3, SmolLM2, TinyLlama, ...); any other, mixture-of-experts,
// sliding-window attention, partial RoPE or YaRN scaling is refused with a message saying so.
//
// GGUF stores a matrix's dims as [ne0 = cols (inputs), ne1 = rows (outputs)], and llama's Q/K rows
// permuted for RoPE on adjacent pairs (the converter's job), so RopeLayout::interleaved. A file
// without output.weight ties the classifier to the token embedding. rope_freqs.weight (Llama 3.1
// and later) gives per-frequency RoPE divisors; linear RoPE scaling becomes the same divisors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.hpp"
#include "model/gguf_llama_config.hpp"
#include "tokenizer/gguf_vocab.hpp"
#include "kvdrive/core/error.hpp"
#include "model/model.hpp"

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
  KVD_EXPECT(v.scores.empty() || v.scores.size() == v.tokens.size(), "{}: tokenizer.ggml.scores has {} entries for {} tokens", p, v.scores.size(),
             v.tokens.size());
  KVD_EXPECT(v.token_types.empty() || v.token_types.size() == v.tokens.size(), "{}: tokenizer.ggml.token_type has {} entries for {} tokens", p,
             v.token_types.size(), v.tokens.size());
  const auto id = [&](const char* key) -> std::optional<std::int32_t> {
    const std::optional<std::int64_t> x = f.get_int(key);
    if (!x) return std::nullopt;
    KVD_EXPECT(*x >= 0 && *x <= std::numeric_limits<std::int32_t>::max(), "{}: {} is {}, expected a token id in 0..2^31-1", p, key, *x);
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

inline std::string computable_types() {
  std::string s;
  for (std::uint32_t id = 0; id < 64; ++id)
    if (const GgmlTypeTraits tr = ggml_type_traits(id); tr.name != nullptr && tr.computable) s += (s.empty() ? "" : ", ") + std::string(tr.name);
  return s;
}

/// Takes a model's weights from a GGUF file, each checked for the shape the metadata implies and
/// counted by type; it remembers which tensors were taken, so that no tensor is left unread.
struct WeightReader {
  WeightReader(const GgufFile& file, Model& model) : f(file), m(model), used(file.tensors().size(), false) {}

  const GgufFile& f;
  Model& m;                                ///< its config given; its owned storage takes copies
  std::vector<bool> used;                  ///< by tensor index
  std::map<std::string, int> type_counts;  ///< GGML type name -> tensors taken

  const GgufTensor& get(const std::string& name, const std::vector<std::int64_t>& shape) {
    const std::vector<GgufTensor>& all = f.tensors();
    const GgufTensor* t = f.find_tensor(name);
    KVD_EXPECT(t != nullptr, "{}: tensor '{}' is missing", f.path(), name);
    KVD_EXPECT(same_shape(t->dims, shape), "{}: tensor '{}' has shape {} (ne0 first), the model's metadata implies [{}]", f.path(), name, t->shape(),
               fmt::join(shape, ", "));
    const auto i = static_cast<std::size_t>(t - all.data());
    if (!used[i]) ++type_counts[ggml_type_name(t->type)];
    used[i] = true;
    return *t;
  }
  // The bytes of t at a 4-byte aligned address: in place, or copied when the file's alignment
  // left them misaligned (general.alignment 1 or 2).
  const std::byte* aligned(const GgufTensor& t) {
    if (reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0) return t.data;
    std::vector<float>& copy = m.owned.emplace_back((t.bytes + sizeof(float) - 1) / sizeof(float));
    std::memcpy(copy.data(), t.data, t.bytes);
    return reinterpret_cast<const std::byte*>(copy.data());
  }
  Matrix matrix(const std::string& name, int rows, int cols) {
    const GgufTensor& t = get(name, {cols, rows});
    KVD_EXPECT(ggml_type_traits(t.type).computable, "{}: tensor '{}' is {}, a type the decoder cannot compute with (it computes {})", f.path(), name,
               ggml_type_name(t.type), computable_types());
    return {aligned(t), t.type, rows, cols};
  }
  const float* norm(const std::string& name) {
    const GgufTensor& t = get(name, {m.config.dim});
    if (t.type == GgmlType::F32) return reinterpret_cast<const float*>(aligned(t));
    KVD_EXPECT(t.type == GgmlType::F16 || t.type == GgmlType::BF16, "{}: tensor '{}' is {}; norm weights must be F32, F16 or BF16", f.path(), name,
               ggml_type_name(t.type));
    return m.owned.emplace_back(floats(f, t)).data();
  }

  /// Every tensor of the file must have been taken.
  void check_all_used() const {
    const std::vector<GgufTensor>& all = f.tensors();
    for (std::size_t i = 0; i < all.size(); ++i)
      KVD_EXPECT(used[i],
                 "{}: tensor '{}' is not part of a {}-layer llama model as this loader reads it (biases, experts and extra layers are not supported)",
                 f.path(), gguf_printable(all[i].name), m.config.layers);
  }
  /// The weight types taken, the most common first: "Q4_K (96), Q6_K (17), F32 (61)".
  std::string types_summary() const {
    std::vector<std::pair<std::string, int>> types(type_counts.begin(), type_counts.end());
    std::stable_sort(types.begin(), types.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    std::string s;
    for (const auto& [name, n] : types) s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", name, n);
    return s;
  }
};

}  // namespace gguf_loader_detail

/// A llama model from an open GGUF file; the model keeps the file's map alive (Model::file).
inline Model load_gguf(const GgufFile& f) {
  const std::string& p = f.path();
  Model m;
  m.source = p;
  m.config = gguf_llama_config(f);
  const LlamaConfig& c = m.config;
  if (const auto n = f.get_int("split.count"); n && *n > 1)
    fail("{}: one of {} shards of a split GGUF (split.count); merge them into one file first (llama-gguf-split --merge)", p, *n);
  // 9 tensors a layer: a block count the tensors cannot back is refused before anything is sized by it.
  KVD_EXPECT(static_cast<std::uint64_t>(c.layers) <= f.tensors().size() / 9,
             "{}: llama.block_count is {}, but the file has only {} tensors (9 a layer)", p, c.layers, f.tensors().size());
  gguf_loader_detail::WeightReader r(f, m);

  m.token_embedding = r.matrix("token_embd.weight", c.vocab, c.dim);
  m.layers.resize(static_cast<std::size_t>(c.layers));  // bounded by the tensors above
  for (int l = 0; l < c.layers; ++l) {
    LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
    const std::string b = fmt::format("blk.{}.", l);
    w.rms_att = r.norm(b + "attn_norm.weight");
    w.wq = r.matrix(b + "attn_q.weight", c.dim, c.dim);
    w.wk = r.matrix(b + "attn_k.weight", c.kv_dim(), c.dim);
    w.wv = r.matrix(b + "attn_v.weight", c.kv_dim(), c.dim);
    w.wo = r.matrix(b + "attn_output.weight", c.dim, c.dim);
    w.rms_ffn = r.norm(b + "ffn_norm.weight");
    w.w1 = r.matrix(b + "ffn_gate.weight", c.hidden_dim, c.dim);
    w.w2 = r.matrix(b + "ffn_down.weight", c.dim, c.hidden_dim);
    w.w3 = r.matrix(b + "ffn_up.weight", c.hidden_dim, c.dim);
  }
  m.rms_final = r.norm("output_norm.weight");
  m.classifier = c.tied_embeddings ? m.token_embedding : r.matrix("output.weight", c.vocab, c.dim);
  if (!c.rope_freq_factors.empty() && f.find_tensor("rope_freqs.weight") != nullptr)
    r.get("rope_freqs.weight", {c.head_dim() / 2});  // read by gguf_llama_config; counted here
  r.check_all_used();
  m.weight_types = r.types_summary();
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
