// The SentencePiece (SPM) merges of the GGUF tokenizer's "llama" model: spaces become U+2581,
// adjacent UTF-8 characters merge while their concatenation is a token, the highest score first
// (the leftmost of equal scores first), and what forms no token is spelt with the byte tokens
// <0xXX>.
#pragma once

#include <array>
#include <cstddef>
#include <queue>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"
#include "tokenizer/tokenizer_merge_symbols.hpp"
#include "tokenizer/tokenizer_token_table.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

/// Each byte's token: <0xXX>, else the token of the byte itself, else -1.
inline std::array<int, 256> spm_byte_tokens(const TokenTable& t) {
  std::array<int, 256> tokens{};
  tokens.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const std::string hex = fmt::format("<0x{:02X}>", b);
    if (auto it = t.token_to_id.find(hex); it != t.token_to_id.end()) tokens[static_cast<std::size_t>(b)] = it->second;
    else if (auto it1 = t.token_to_id.find(std::string(1, static_cast<char>(b))); it1 != t.token_to_id.end())
      tokens[static_cast<std::size_t>(b)] = it1->second;
  }
  return tokens;
}

/// Spaces as U+2581 (the text SPM tokens hold).
inline std::string escape_spaces(const std::string& s) {
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (const char c : s) {
    if (c == ' ') out += "\xE2\x96\x81";
    else out += c;
  }
  return out;
}

/// A normal SPM token's text: U+2581 back to spaces.
inline std::string spm_piece(const std::string& t) {
  std::string out;
  for (std::size_t k = 0; k < t.size(); ++k) {
    if (t.compare(k, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      k += 2;
    } else {
      out += t[k];
    }
  }
  return out;
}

/// SentencePiece merges of one (escaped) fragment.
inline void spm_merge(const std::string& text, const TokenTable& t, const std::array<int, 256>& byte_tokens, std::vector<int>& out) {
  MergeSymbols sym(text);
  struct Pair {
    float score;
    int left, right;
    std::size_t size;
  };
  auto lower = [](const Pair& a, const Pair& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  std::priority_queue<Pair, std::vector<Pair>, decltype(lower)> queue(lower);
  std::string key;
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const MergeSymbols::Sym& a = sym[l];
    const MergeSymbols::Sym& b = sym[r];
    key.assign(text, a.off, a.n + b.n);
    const auto it = t.token_to_id.find(key);
    if (it != t.token_to_id.end()) queue.push({t.scores[static_cast<std::size_t>(it->second)], l, r, a.n + b.n});
  };
  for (int i = 1; i < sym.size(); ++i) add(i - 1, i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    const MergeSymbols::Sym& a = sym[p.left];
    const MergeSymbols::Sym& b = sym[p.right];
    if (a.n == 0 || b.n == 0 || a.n + b.n != p.size) continue;  // stale
    sym.merge(p.left, p.right);
    add(a.prev, p.left);
    add(p.left, a.next);
  }
  for (int i = sym.sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
    const MergeSymbols::Sym& s = sym[i];
    key.assign(text, s.off, s.n);
    if (auto it = t.token_to_id.find(key); it != t.token_to_id.end()) {
      out.push_back(it->second);
      continue;
    }
    for (const char c : key) {  // spelt with byte tokens
      const int id = byte_tokens[static_cast<unsigned char>(c)];
      KVD_EXPECT(id >= 0, "the vocabulary has no token for byte 0x{:02X} (no <0x{:02X}>)", static_cast<unsigned char>(c),
                 static_cast<unsigned char>(c));
      out.push_back(id);
    }
  }
}

}  // namespace kvdrive::llama::gguf_tokenizer_detail
