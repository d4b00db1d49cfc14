// The GGUF tokenizer's pre-tokenizer: splits text into words as llama.cpp's regexes for each family
// (tokenizer_pre_names.hpp) do, each regex splitting the pieces of the one before. The regexes are
// matched by hand-written scanners over code points (as llama.cpp's own fast paths do for the
// gpt2, llama3 and qwen2 patterns), with the Unicode classes of tokenizer_unicode.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer_pre_names.hpp"
#include "tokenizer/tokenizer_unicode.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

/// Piece lengths (in code points) of a split, chunk after chunk.
using Pieces = std::vector<std::size_t>;

/// Splits each chunk of `in` with split(begin, end, out), which appends the lengths of its pieces.
template <class Split>
Pieces refine(const Pieces& in, Split&& split) {
  Pieces out;
  out.reserve(in.size() * 2);
  std::size_t at = 0;
  for (const std::size_t len : in) {
    split(at, at + len, out);
    at += len;
  }
  return out;
}

/// The pre-tokenizer over code points cp with their classes cls.
class PreSplitter {
 public:
  PreSplitter(const std::vector<std::uint32_t>& cp, const std::vector<std::uint8_t>& cls) : cp_(cp), cls_(cls) {}

  Pieces run(PreFamily family) const {
    Pieces p{cp_.size()};
    auto isolate = [&](auto pred, std::size_t max_run) {
      p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { isolate_runs(b, e, pred, max_run, out); });
    };
    auto is_number = [&](std::size_t i) { return (cls_[i] & kNumber) != 0; };
    switch (family) {
      case PreFamily::default_:
        isolate(
            [&](std::size_t i) {
              const std::uint32_t c = cp_[i];
              return (cls_[i] & kPunct) != 0 || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|';
            },
            SIZE_MAX);
        p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { gpt2(b, e, out); });
        isolate(is_number, SIZE_MAX);
        p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { ascii_digit_triples(b, e, out); });
        break;
      case PreFamily::gpt2: p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { gpt2(b, e, out); }); break;
      case PreFamily::smollm:
        isolate(is_number, 1);
        p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { gpt2(b, e, out); });
        break;
      case PreFamily::llama3: p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { llama3(b, e, 3, out); }); break;
      case PreFamily::qwen2: p = refine(p, [&](std::size_t b, std::size_t e, Pieces& out) { llama3(b, e, 1, out); }); break;
    }
    return p;
  }

 private:
  static void emit(std::size_t len, Pieces& out) {
    if (len > 0) out.push_back(len);
  }

  /// A regex of one class run (pred+ or pred{1,max_run}): matches, and the text between them, are pieces.
  template <class Pred>
  static void isolate_runs(std::size_t b, std::size_t e, Pred pred, std::size_t max_run, Pieces& out) {
    std::size_t gap = b, i = b;
    while (i < e) {
      if (!pred(i)) {
        ++i;
        continue;
      }
      emit(i - gap, out);
      std::size_t j = i;
      while (j < e && j - i < max_run && pred(j)) ++j;
      emit(j - i, out);
      i = gap = j;
    }
    emit(e - gap, out);
  }

  /// [0-9][0-9][0-9]: three ASCII digits, leftmost first.
  void ascii_digit_triples(std::size_t b, std::size_t e, Pieces& out) const {
    auto digit = [&](std::size_t i) { return cp_[i] >= '0' && cp_[i] <= '9'; };
    std::size_t gap = b, i = b;
    while (i < e) {
      if (i + 3 <= e && digit(i) && digit(i + 1) && digit(i + 2)) {
        emit(i - gap, out);
        emit(3, out);
        i = gap = i + 3;
      } else {
        ++i;
      }
    }
    emit(e - gap, out);
  }

  /// Class of position i of chunk [., e): 0xFF past its end (no class at all).
  std::uint8_t at(std::size_t i, std::size_t e) const { return i < e ? cls_[i] : 0xFF; }
  static bool letter(std::uint8_t c) { return c != 0xFF && (c & kLetter); }
  static bool number(std::uint8_t c) { return c != 0xFF && (c & kNumber); }
  static bool space(std::uint8_t c) { return c != 0xFF && (c & kSpace); }
  /// [^\s\p{L}\p{N}] (and inside the chunk).
  static bool rest(std::uint8_t c) { return c != 0xFF && !(c & (kSpace | kLetter | kNumber)); }

  /// The contraction at i, if any: 's 't 'm 'd (2) or 're 've 'll (3); ASCII case folded if fold.
  std::size_t contraction(std::size_t i, std::size_t e, bool fold) const {
    if (cp_[i] != '\'' || i + 1 >= e) return 0;
    auto low = [&](std::uint32_t c) { return fold && c >= 'A' && c <= 'Z' ? c + 32 : c; };
    const std::uint32_t n1 = low(cp_[i + 1]);
    if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
    if (i + 2 < e) {
      const std::uint32_t n2 = low(cp_[i + 2]);
      if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return 3;
    }
    return 0;
  }

  /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) over [b, e); a
  /// lone whitespace before a non-space (no match) is a piece of its own.
  void gpt2(std::size_t b, std::size_t e, Pieces& out) const {
    std::size_t i = b;
    while (i < e) {
      if (const std::size_t n = contraction(i, e, false)) {
        emit(n, out);
        i += n;
        continue;
      }
      const std::size_t s = cp_[i] == ' ' ? 1 : 0;  // the optional leading space
      const std::uint8_t first = at(i + s, e);
      std::size_t j = i + s;
      if (letter(first)) {
        while (letter(at(j, e))) ++j;
      } else if (number(first)) {
        while (number(at(j, e))) ++j;
      } else if (rest(first)) {
        while (rest(at(j, e))) ++j;
      } else {
        j = i;
        while (space(at(j, e))) ++j;
        const std::size_t n = j - i;
        j = n > 1 && j < e ? j - 1 : n > 0 ? j : i + 1;  // \s+(?!\S) leaves the last space to what follows
      }
      emit(j - i, out);
      i = j;
    }
  }

  /// The llama3 pattern over [b, e), numbers in runs of at most max_digits (3: llama3, 1: qwen2).
  void llama3(std::size_t b, std::size_t e, std::size_t max_digits, Pieces& out) const {
    std::size_t i = b;
    while (i < e) {
      if (const std::size_t n = contraction(i, e, true)) {
        emit(n, out);
        i += n;
        continue;
      }
      const std::uint32_t c = cp_[i];
      const std::uint8_t k = cls_[i];
      std::size_t j = i;
      if (!(c == '\r' || c == '\n' || (k & kNumber)) && ((k & kLetter) || letter(at(i + 1, e)))) {
        // [^\r\n\p{L}\p{N}]?\p{L}+
        ++j;
        while (letter(at(j, e))) ++j;
      } else if (k & kNumber) {
        // \p{N}{1,3} (or \p{N})
        while (j < e && j - i < max_digits && number(at(j, e))) ++j;
      } else if (const std::size_t s = c == ' ' ? 1 : 0; !space(at(i + s, e)) && !letter(at(i + s, e)) && !number(at(i + s, e))) {
        // " ?[^\s\p{L}\p{N}]+[\r\n]*" (a space alone at the chunk's end ends here too, as \s+ would take it)
        j = i + s;
        while (rest(at(j, e))) ++j;
        while (j < e && (cp_[j] == '\r' || cp_[j] == '\n')) ++j;
      } else {
        // \s*[\r\n]+ | \s+(?!\S) | \s+
        std::size_t last_newline = 0;
        while (space(at(j, e))) {
          if (cp_[j] == '\r' || cp_[j] == '\n') last_newline = j + 1;
          ++j;
        }
        const std::size_t n = j - i;
        if (last_newline > 0) j = last_newline;
        else if (n > 1 && j < e) j = j - 1;
        else if (n == 0) j = i + 1;
      }
      emit(j - i, out);
      i = j;
    }
  }

  const std::vector<std::uint32_t>& cp_;
  const std::vector<std::uint8_t>& cls_;
};

/// Calls f(word) for each pre-tokenizer word of ordinary text, as UTF-8.
template <class F>
void for_each_word(std::string_view text, PreFamily family, F&& f) {
  const std::vector<std::uint32_t> cp = decode_utf8(text);
  const UnicodeClasses& uc = unicode_classes();
  std::vector<std::uint8_t> cls(cp.size());
  for (std::size_t i = 0; i < cp.size(); ++i) cls[i] = uc(cp[i]);
  const Pieces pieces = PreSplitter(cp, cls).run(family);
  std::size_t at = 0;
  for (const std::size_t len : pieces) {
    std::string w;
    for (std::size_t i = at; i < at + len; ++i) append_utf8(cp[i], w);
    at += len;
    f(std::move(w));
  }
}

}  // namespace kvdrive::llama::gguf_tokenizer_detail
