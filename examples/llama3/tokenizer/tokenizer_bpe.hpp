// The byte-level BPE of the GGUF tokenizer's "gpt2" model: GPT-2's printable stand-ins for bytes,
// the merge ranks of tokenizer.ggml.merges, and the merges of one pre-tokenizer word: adjacent
// parts merge, the pair of lowest rank first, the leftmost of equal ranks first; a part that is no
// token falls back to the tokens of its single bytes (skipping those that are none, as llama.cpp
// does).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"
#include "tokenizer/tokenizer_merge_symbols.hpp"
#include "tokenizer/tokenizer_token_table.hpp"
#include "tokenizer/tokenizer_unicode.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

/// GPT-2's printable stand-in for byte b.
inline std::uint32_t byte_char(std::uint8_t b) {
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
  // The others, in byte order, become U+0100, U+0101, ...
  std::uint32_t k = 0;
  for (std::uint32_t x = 0; x < b; ++x)
    if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++k;
  return 0x100 + k;
}

/// The byte GPT-2's character c stands for, or -1.
inline int char_byte(std::uint32_t c) {
  static const std::array<int, 0x144> table = [] {
    std::array<int, 0x144> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_char(static_cast<std::uint8_t>(b))] = b;
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

/// Each byte's GPT-2 character, as UTF-8.
inline std::array<std::string, 256> byte_chars_utf8() {
  std::array<std::string, 256> chars;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(byte_char(static_cast<std::uint8_t>(b)), s);
    chars[static_cast<std::size_t>(b)] = s;
  }
  return chars;
}

/// "left right" -> merge rank (its index in tokenizer.ggml.merges).
using MergeRanks = std::unordered_map<std::string, int>;

/// Merges: "left right", split at the first space after the first byte; the first of equal pairs counts.
inline MergeRanks read_merge_ranks(const std::vector<std::string>& merges) {
  KVD_EXPECT(!merges.empty(), "a 'gpt2' tokenizer needs tokenizer.ggml.merges (none given)");
  MergeRanks ranks;
  ranks.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    ranks.emplace(sp == std::string::npos ? std::string(" ") : m, static_cast<int>(i));
  }
  return ranks;
}

/// The tokens of one word (its bytes as GPT-2 characters) after its merges.
inline void bpe_merge_word(const std::string& word, const MergeRanks& ranks, const TokenTable& t, std::vector<int>& out) {
  MergeSymbols sym(word);
  struct Pair {
    int rank, left, right;
    std::size_t left_n, right_n;
  };
  auto later = [](const Pair& a, const Pair& b) { return a.rank > b.rank || (a.rank == b.rank && a.left > b.left); };
  std::priority_queue<Pair, std::vector<Pair>, decltype(later)> queue(later);
  std::string key;
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const MergeSymbols::Sym& a = sym[l];
    const MergeSymbols::Sym& b = sym[r];
    key.assign(word, a.off, a.n);
    key += ' ';
    key.append(word, b.off, b.n);
    const auto it = ranks.find(key);
    if (it != ranks.end()) queue.push({it->second, l, r, a.n, b.n});
  };
  for (int i = 1; i < sym.size(); ++i) add(i - 1, i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    const MergeSymbols::Sym& a = sym[p.left];
    const MergeSymbols::Sym& b = sym[p.right];
    if (a.n == 0 || b.n == 0 || a.n != p.left_n || b.n != p.right_n) continue;  // stale
    sym.merge(p.left, p.right);
    add(a.prev, p.left);
    add(p.left, a.next);
  }
  for (const MergeSymbols::Sym& s : sym.sym) {
    if (s.n == 0) continue;
    key.assign(word, s.off, s.n);
    if (auto it = t.token_to_id.find(key); it != t.token_to_id.end()) {
      out.push_back(it->second);
      continue;
    }
    for (const char c : key)  // single bytes of the part's text that are tokens
      if (auto it1 = t.token_to_id.find(std::string(1, c)); it1 != t.token_to_id.end()) out.push_back(it1->second);
  }
}

/// A normal BPE token's text: GPT-2 characters back to bytes; one that stands for none is spelt
/// out, as llama.cpp does.
inline std::string bpe_piece(const std::string& t) {
  std::string out;
  for (const std::uint32_t c : decode_utf8(t)) {
    const int b = char_byte(c);
    if (b >= 0) {
      out += static_cast<char>(b);
      continue;
    }
    std::string u;
    append_utf8(c, u);
    out += "[UNK_BYTE_0x";
    for (const char ch : u) out += fmt::format("{:02x}", static_cast<unsigned char>(ch));
    out += t + "]";
  }
  return out;
}

}  // namespace kvdrive::llama::gguf_tokenizer_detail
