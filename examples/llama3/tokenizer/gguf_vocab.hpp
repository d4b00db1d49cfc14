// GgufVocab: a tokenizer's description as a GGUF file's `tokenizer.ggml.*` metadata holds it,
// as plain data. gguf_loader.hpp fills it from a file; tokenizer_gguf.hpp builds the tokenizer
// from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvdrive::llama {

/// GGUF token types (tokenizer.ggml.token_type), as llama.cpp numbers them.
enum class GgufTokenType : std::int32_t { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct GgufVocab {
  std::string model;                      ///< tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece), ...
  std::string pre;                        ///< tokenizer.ggml.pre: the pre-tokenizer ("smollm", "gpt2", "llama-bpe", "qwen2", ...); may be empty
  std::vector<std::string> tokens;        ///< tokenizer.ggml.tokens
  std::vector<float> scores;              ///< tokenizer.ggml.scores (may be empty)
  std::vector<std::int32_t> token_types;  ///< tokenizer.ggml.token_type (may be empty: all normal)
  std::vector<std::string> merges;        ///< tokenizer.ggml.merges, "left right" in rank order (BPE)
  std::optional<std::int32_t> bos, eos, eot, eom, unk, pad, sep;  ///< tokenizer.ggml.*_token_id
  std::optional<bool> add_bos, add_eos;                           ///< tokenizer.ggml.add_bos_token / add_eos_token
  std::optional<bool> add_space_prefix;                           ///< tokenizer.ggml.add_space_prefix
  std::string chat_template;                                      ///< tokenizer.chat_template (may be empty)
};

}  // namespace kvdrive::llama
