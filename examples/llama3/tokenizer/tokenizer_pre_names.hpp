// The pre-tokenizers a GGUF file's tokenizer.ggml.pre can name, as llama.cpp maps the names: the
// family each belongs to (the regexes it splits text with, spelt here as llama.cpp spells them;
// tokenizer_pre_split.hpp implements them), and the settings that come with the name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

/// The pre-tokenizer families (see tokenizer_gguf.hpp's file comment).
enum class PreFamily { default_, gpt2, smollm, llama3, qwen2 };

/// llama.cpp's regexes (llama-vocab.cpp), which the scanners of tokenizer_pre_split.hpp implement.
inline constexpr std::string_view kRegexGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
inline constexpr std::string_view kRegexLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kRegexQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kRegexPunct = R"([\p{P}\$\+<=>\^~\|]+)";

inline std::vector<std::string_view> pre_regexes(PreFamily f) {
  switch (f) {
    case PreFamily::default_: return {kRegexPunct, kRegexGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
    case PreFamily::gpt2: return {kRegexGpt2};
    case PreFamily::smollm: return {R"(\p{N})", kRegexGpt2};
    case PreFamily::llama3: return {kRegexLlama3};
    case PreFamily::qwen2: return {kRegexQwen2};
  }
  return {};
}

struct PreName {
  std::string_view name;
  PreFamily family;
  bool clean_spaces;   ///< detokenize tidies " ." and " 's" (llama.cpp's clean_spaces)
  bool ignore_merges;  ///< a word that is a token is that token, merges or not
  bool add_bos;        ///< the default of add_bos_token
};

/// tokenizer.ggml.pre values, as llama.cpp maps them (those of the families here and no other flags).
inline constexpr PreName kPreNames[] = {
    {"default", PreFamily::default_, true, false, false},
    {"gpt-2", PreFamily::gpt2, true, false, false},
    {"phi-2", PreFamily::gpt2, true, false, false},
    {"jina-es", PreFamily::gpt2, true, false, false},
    {"jina-de", PreFamily::gpt2, true, false, false},
    {"gigachat", PreFamily::gpt2, true, false, false},
    {"a.x-4.0", PreFamily::gpt2, true, false, false},
    {"mellum", PreFamily::gpt2, true, false, false},
    {"exaone4", PreFamily::gpt2, true, false, false},
    {"mpt", PreFamily::gpt2, true, false, false},
    {"olmo", PreFamily::gpt2, true, false, false},
    {"jais", PreFamily::gpt2, true, false, false},
    {"trillion", PreFamily::gpt2, false, false, false},
    {"granite-docling", PreFamily::gpt2, false, false, false},
    {"smollm", PreFamily::smollm, false, false, false},
    {"starcoder", PreFamily::smollm, true, false, false},
    {"refact", PreFamily::smollm, true, false, false},
    {"command-r", PreFamily::smollm, false, false, false},
    {"codeshell", PreFamily::smollm, true, false, false},
    {"exaone", PreFamily::smollm, true, false, false},
    {"minerva-7b", PreFamily::smollm, true, false, false},
    {"mellum2", PreFamily::smollm, true, false, false},
    {"llama3", PreFamily::llama3, true, true, true},
    {"llama-v3", PreFamily::llama3, true, true, true},
    {"llama-bpe", PreFamily::llama3, true, true, true},
    {"falcon3", PreFamily::llama3, true, true, true},
    {"falcon-h1", PreFamily::llama3, true, true, true},
    {"pixtral", PreFamily::llama3, true, true, true},
    {"midm-2.0", PreFamily::llama3, true, true, true},
    {"lfm2", PreFamily::llama3, true, true, true},
    {"jina-v5-nano", PreFamily::llama3, true, true, true},
    {"dbrx", PreFamily::llama3, true, false, false},
    {"smaug-bpe", PreFamily::llama3, true, false, false},
    {"qwen2", PreFamily::qwen2, false, false, false},
    {"deepseek-r1-qwen", PreFamily::qwen2, false, false, false},
    {"kormo", PreFamily::qwen2, false, false, false},
    {"f2llmv2", PreFamily::qwen2, false, false, false},
    {"megrez", PreFamily::qwen2, true, false, false},
    {"stablelm2", PreFamily::qwen2, true, false, false},
    {"hunyuan", PreFamily::qwen2, false, false, false},
    {"solar-open", PreFamily::qwen2, false, false, false},
};

/// The entry of kPreNames for tokenizer.ggml.pre `pre`; an unknown name is an error listing the known ones.
inline const PreName& find_pre_name(const std::string& pre) {
  const PreName* found = nullptr;
  for (const PreName& p : kPreNames)
    if (p.name == pre) found = &p;
  if (found == nullptr) {
    std::string known;
    for (const PreName& p : kPreNames) known += fmt::format("{}'{}'", known.empty() ? "" : ", ", p.name);
    fail("unknown pre-tokenizer type '{}' (tokenizer.ggml.pre); known: {} (or none)", pre, known);
  }
  return *found;
}

}  // namespace kvdrive::llama::gguf_tokenizer_detail
