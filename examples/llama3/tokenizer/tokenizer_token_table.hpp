// The token table of a GgufTokenizer, read from a GgufVocab (tokenizer.ggml.tokens, scores and
// token_type): each token's text, score and attributes (llama.cpp's llama_token_attr values), and
// the map from a token's text to its id, built as llama.cpp builds its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/gguf_vocab.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

/// Token attributes, with llama.cpp's values (llama_token_attr).
enum TokenAttr : std::uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

/// The attribute of a GGUF token type (tokenizer.ggml.token_type); an unknown type is undefined.
inline std::uint32_t token_type_attr(std::int32_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

/// The tokens by id (text, score, attributes) and by text.
struct TokenTable {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::uint32_t> attrs;
  /// Built as llama.cpp builds its map (operator[] in id order), so that walking it meets the
  /// tokens in llama.cpp's order, which picks EOT when several tokens qualify.
  std::unordered_map<std::string, std::int32_t> token_to_id;

  std::size_t size() const { return tokens.size(); }
  const std::string& text(int id) const { return tokens[static_cast<std::size_t>(id)]; }
  std::uint32_t& attr(int id) { return attrs[static_cast<std::size_t>(id)]; }
  std::uint32_t attr(int id) const { return attrs[static_cast<std::size_t>(id)]; }
};

/// Tokens, scores, types: the table of v's tokens (moved out of v). An empty token text becomes
/// "[EMPTY_<id>]"; a token whose text repeats another's is an error.
inline TokenTable read_token_table(GgufVocab& v) {
  const std::size_t n = v.tokens.size();
  KVD_EXPECT(n > 0, "tokenizer.ggml.tokens is empty");
  KVD_EXPECT(n < static_cast<std::size_t>(INT32_MAX), "{} tokens: too many", n);
  KVD_EXPECT(v.scores.empty() || v.scores.size() >= n, "tokenizer.ggml.scores has {} entries for {} tokens", v.scores.size(), n);
  KVD_EXPECT(v.token_types.empty() || v.token_types.size() >= n, "tokenizer.ggml.token_type has {} entries for {} tokens", v.token_types.size(), n);
  TokenTable t;
  t.tokens = std::move(v.tokens);
  t.scores.assign(n, 0.0f);
  t.attrs.assign(n, kAttrNormal);
  for (std::size_t i = 0; i < n; ++i) {
    if (t.tokens[i].empty()) t.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
    t.token_to_id[t.tokens[i]] = static_cast<int>(i);
    if (!v.scores.empty()) t.scores[i] = v.scores[i];
    if (!v.token_types.empty()) t.attrs[i] = token_type_attr(v.token_types[i]);
  }
  if (t.token_to_id.size() != n) {
    std::unordered_map<std::string_view, std::size_t> seen;
    for (std::size_t i = 0; i < n; ++i)
      if (auto [it, fresh] = seen.emplace(t.tokens[i], i); !fresh)
        fail("tokenizer.ggml.tokens: token {} repeats token {} ('{}')", i, it->second, t.tokens[i]);
  }
  return t;
}

}  // namespace kvdrive::llama::gguf_tokenizer_detail
