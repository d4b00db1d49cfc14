// Tokenizer: one interface over three tokenizers. From a file: one whose first line looks like
// "base64 rank" is a tiktoken (Llama-3) vocabulary, anything else is read as llama2.c's
// tokenizer.bin. From a GgufVocab (a GGUF model's tokenizer.ggml.* metadata): the GGUF tokenizer,
// which gives llama.cpp's ids (tokenizer_gguf.hpp).
#pragma once

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tokenizer/gguf_vocab.hpp"
#include "tokenizer/tokenizer_gguf.hpp"
#include "tokenizer/tokenizer_llama2c.hpp"
#include "tokenizer/tokenizer_tiktoken.hpp"

namespace kvdrive::llama {

class Tokenizer {
 public:
  /// vocab: the model's vocabulary size (llama2.c files do not record it).
  Tokenizer(const std::string& path, int vocab) : impl_(open(path, vocab)) {
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_))
      KVD_EXPECT(t->vocab() <= vocab, "{}: {} tokens, more than the model's vocabulary of {}", path, t->vocab(), vocab);
  }
  /// The tokenizer a GGUF file describes.
  explicit Tokenizer(GgufVocab vocab) : impl_(std::in_place_type<GgufTokenizer>, std::move(vocab)) {}

  bool is_tiktoken() const { return std::holds_alternative<TiktokenTokenizer>(impl_); }
  bool is_gguf() const { return std::holds_alternative<GgufTokenizer>(impl_); }
  /// The GGUF tokenizer (nullptr for the others), for what only it has.
  const GgufTokenizer* gguf() const { return std::get_if<GgufTokenizer>(&impl_); }

  /// The BOS id (GGUF: tokenizer.ggml.bos_token_id or llama.cpp's default; -1 if it has none).
  int bos() const {
    if (auto* g = gguf()) return g->bos();
    return is_tiktoken() ? std::get<TiktokenTokenizer>(impl_).bos() : Llama2cTokenizer::kBos;
  }
  /// Whether a prompt starts with BOS by default (GGUF: tokenizer.ggml.add_bos_token, as llama.cpp
  /// resolves it; SmolLM2 says no).
  bool adds_bos() const {
    if (auto* g = gguf()) return g->add_bos() && g->bos() >= 0;
    return true;
  }
  /// adds_bos(), unless `text` already starts with the BOS token's text (a chat template that
  /// writes it), which would give two.
  bool adds_bos(std::string_view text) const {
    if (!adds_bos()) return false;
    if (auto* g = gguf()) return !text.starts_with(g->text(g->bos()));
    if (is_tiktoken()) return !text.starts_with("<|begin_of_text|>");
    return true;
  }

  /// Tokens that end generation (GGUF: llama.cpp's end-of-generation set, EOS, EOT, <|im_end|>, ...).
  std::vector<int> stops() const {
    if (auto* g = gguf()) return g->eog();
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_)) return {t->eos(), t->eot()};
    return {Llama2cTokenizer::kEos};
  }

  /// The ids of `text`, BOS first when `bos`. GGUF: special-token strings are plain text here
  /// (llama.cpp's parse_special = false); tiktoken: they are tokens; llama2.c has none.
  std::vector<int> encode(const std::string& text, bool bos) const {
    if (gguf()) return encode(text, bos, false);
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_)) return t->encode(text, bos);
    return std::get<Llama2cTokenizer>(impl_).encode(text, bos);
  }
  /// The ids of `text`, BOS first when `bos`; with `special`, control and user-defined token
  /// strings in it (<|im_start|>, ...) are their tokens, as llama.cpp's parse_special. Only GGUF
  /// tokenizers choose: tiktoken always parses them, llama2.c has none.
  std::vector<int> encode(const std::string& text, bool bos, bool special) const {
    if (auto* g = gguf()) {
      std::vector<int> ids;
      if (bos) {
        KVD_EXPECT(g->bos() >= 0, "the tokenizer has no BOS token");
        ids.push_back(g->bos());
      }
      const std::vector<int> rest = g->tokenize(text, false, special);
      ids.insert(ids.end(), rest.begin(), rest.end());
      return ids;
    }
    return encode(text, bos);
  }

  /// The text of `id` following `prev` (GGUF: llama.cpp's piece; control tokens show nothing).
  std::string decode(int prev, int id) const {
    if (auto* g = gguf()) return g->token_to_piece(id, false);
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_)) return t->decode(id);
    return std::get<Llama2cTokenizer>(impl_).decode(prev, id);
  }

  /// The id of the token whose text is `piece` (GGUF: as the vocabulary stores it; tiktoken: the
  /// special tokens and the pieces' bytes; llama2.c: the piece as stored), if there is one.
  std::optional<int> token_id(std::string_view piece) const {
    if (auto* g = gguf()) return g->token_id(piece);
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_)) {
      for (int id = t->vocab() - 1; id >= 0; --id)  // specials (last) first
        if (t->decode(id) == piece) return id;
      return std::nullopt;
    }
    const auto& l = std::get<Llama2cTokenizer>(impl_);
    for (int id = 0; id < l.vocab(); ++id)
      if (l.piece(id) == piece) return id;
    return std::nullopt;
  }

 private:
  using Impl = std::variant<Llama2cTokenizer, TiktokenTokenizer, GgufTokenizer>;

  static Impl open(const std::string& path, int vocab) {
    std::ifstream f(path, std::ios::binary);
    KVD_EXPECT(f.good(), "{}: cannot open", path);
    std::string first;
    std::getline(f, first);
    const auto sp = first.find(' ');
    const bool tiktoken = sp != std::string::npos && sp > 0 && sp % 4 == 0 &&
                          first.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == sp &&
                          first.find_first_not_of("0123456789\r", sp + 1) == std::string::npos;
    if (tiktoken) return Impl(std::in_place_type<TiktokenTokenizer>, path);
    return Impl(std::in_place_type<Llama2cTokenizer>, path, vocab);
  }

  Impl impl_;
};

}  // namespace kvdrive::llama
