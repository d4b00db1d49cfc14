// Tokenizer: either of the two formats behind one interface. A file whose first line looks like
// "base64 rank" is a tiktoken (Llama-3) vocabulary; anything else is read as llama2.c's
// tokenizer.bin.
#pragma once

#include <fstream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tokenizer_llama2c.hpp"
#include "tokenizer_tiktoken.hpp"

namespace kvdrive::llama {

class Tokenizer {
 public:
  /// vocab: the model's vocabulary size (llama2.c files do not record it).
  Tokenizer(const std::string& path, int vocab) : impl_(open(path, vocab)) {
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_))
      KVD_EXPECT(t->vocab() <= vocab, "{}: {} tokens, more than the model's vocabulary of {}", path, t->vocab(), vocab);
  }

  bool is_tiktoken() const { return std::holds_alternative<TiktokenTokenizer>(impl_); }
  int bos() const { return is_tiktoken() ? std::get<TiktokenTokenizer>(impl_).bos() : Llama2cTokenizer::kBos; }
  /// Tokens that end generation.
  std::vector<int> stops() const {
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_)) return {t->eos(), t->eot()};
    return {Llama2cTokenizer::kEos};
  }

  std::vector<int> encode(const std::string& text, bool bos) const {
    return std::visit([&](const auto& t) { return t.encode(text, bos); }, impl_);
  }
  /// The text of `id` following `prev`.
  std::string decode(int prev, int id) const {
    if (auto* t = std::get_if<TiktokenTokenizer>(&impl_)) return t->decode(id);
    return std::get<Llama2cTokenizer>(impl_).decode(prev, id);
  }

 private:
  static std::variant<Llama2cTokenizer, TiktokenTokenizer> open(const std::string& path, int vocab) {
    std::ifstream f(path, std::ios::binary);
    KVD_EXPECT(f.good(), "{}: cannot open", path);
    std::string first;
    std::getline(f, first);
    const auto sp = first.find(' ');
    const bool tiktoken = sp != std::string::npos && sp > 0 && sp % 4 == 0 &&
                          first.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == sp &&
                          first.find_first_not_of("0123456789\r", sp + 1) == std::string::npos;
    if (tiktoken) return TiktokenTokenizer(path);
    return Llama2cTokenizer(path, vocab);
  }

  std::variant<Llama2cTokenizer, TiktokenTokenizer> impl_;
};

}  // namespace kvdrive::llama
