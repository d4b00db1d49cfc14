// What both merge engines of the GGUF tokenizer (byte-level BPE in tokenizer_bpe.hpp, SentencePiece
// in tokenizer_spm.hpp) work on: a text's UTF-8 characters as a linked list of byte ranges, two
// neighbours joined into one at each merge.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "tokenizer/tokenizer_unicode.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

struct MergeSymbols {
  /// Bytes [off, off + n) of the text; n is 0 once merged into the symbol before it.
  struct Sym {
    int prev, next;
    std::size_t off, n;
  };
  std::vector<Sym> sym;

  /// One symbol per UTF-8 character of text (by its lead byte; a character cut short by the end
  /// keeps the bytes there are).
  explicit MergeSymbols(const std::string& text) {
    for (std::size_t off = 0; off < text.size();) {
      const std::size_t n = std::min(text.size() - off, utf8_len(text[off]));
      const int i = static_cast<int>(sym.size());
      sym.push_back({i - 1, off + n == text.size() ? -1 : i + 1, off, n});
      off += n;
    }
  }

  int size() const { return static_cast<int>(sym.size()); }
  Sym& operator[](int i) { return sym[static_cast<std::size_t>(i)]; }

  /// Joins symbol `right` into its left neighbour `left`.
  void merge(int left, int right) {
    Sym& a = (*this)[left];
    Sym& b = (*this)[right];
    a.n += b.n;
    b.n = 0;
    a.next = b.next;
    if (b.next >= 0) (*this)[b.next].prev = left;
  }
};

}  // namespace kvdrive::llama::gguf_tokenizer_detail
