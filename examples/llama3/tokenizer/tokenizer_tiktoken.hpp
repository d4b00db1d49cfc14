// The Llama-3 tokenizer (tokenizer.model, tiktoken format): one "base64(bytes) rank" line per
// token. Text is split by the Llama-3 pre-tokenizer pattern (Unicode classes, via PCRE2), each
// piece is byte-level BPE: adjacent parts merge, lowest rank first, while the merged bytes are a
// token. Special tokens (<|begin_of_text|>, <|eot_id|>, the header tokens, reserved ones) follow
// the base vocabulary and are matched in the text before BPE.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

class TiktokenTokenizer {
 public:
  static constexpr std::string_view kPattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

  explicit TiktokenTokenizer(const std::string& path) {
    std::ifstream f(path);
    KVD_EXPECT(f.good(), "{}: cannot open", path);
    std::string line;
    std::vector<std::pair<long, std::string>> entries;
    for (int lineno = 1; std::getline(f, line); ++lineno) {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
      if (line.empty()) continue;
      const auto sp = line.find(' ');
      KVD_EXPECT(sp != std::string::npos, "{}:{}: expected 'base64 rank'", path, lineno);
      std::string bytes;
      KVD_EXPECT(base64_decode(std::string_view(line).substr(0, sp), bytes), "{}:{}: invalid base64", path, lineno);
      long rank = -1;
      try {
        std::size_t used = 0;
        rank = std::stol(line.substr(sp + 1), &used);
        if (used != line.size() - sp - 1) rank = -1;
      } catch (const std::exception&) {
      }
      KVD_EXPECT(rank >= 0 && rank < (1L << 30), "{}:{}: invalid rank '{}'", path, lineno, line.substr(sp + 1));
      KVD_EXPECT(ranks_.emplace(bytes, static_cast<int>(rank)).second, "{}:{}: duplicate token", path, lineno);
      entries.emplace_back(rank, std::move(bytes));
    }
    KVD_EXPECT(!ranks_.empty(), "{}: no tokens", path);
    // Ranks are token ids: they must be exactly 0 .. n-1.
    std::sort(entries.begin(), entries.end());
    for (std::size_t i = 0; i < entries.size(); ++i)
      KVD_EXPECT(entries[i].first == static_cast<long>(i), "{}: ranks are not 0..{} without gaps (rank {} missing)", path, entries.size() - 1, i);
    for (auto& e : entries) pieces_.push_back(std::move(e.second));
    base_ = static_cast<int>(pieces_.size());
    // Llama-3's special tokens, in order after the base vocabulary.
    const char* named[] = {"<|begin_of_text|>",
                           "<|end_of_text|>",
                           "<|reserved_special_token_0|>",
                           "<|reserved_special_token_1|>",
                           "<|reserved_special_token_2|>",
                           "<|reserved_special_token_3|>",
                           "<|start_header_id|>",
                           "<|end_header_id|>",
                           "<|reserved_special_token_4|>",
                           "<|eot_id|>"};
    for (const char* s : named) add_special(s);
    for (int i = 5; i < 256 - 5; ++i) add_special("<|reserved_special_token_" + std::to_string(i) + "|>");

    int err = 0;
    PCRE2_SIZE offset = 0;
    re_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern.data()), kPattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr));
    KVD_EXPECT(re_ != nullptr, "tiktoken: cannot compile the pre-tokenizer pattern (PCRE2 error {} at {})", err, offset);
  }

  int vocab() const { return base_ + static_cast<int>(specials_.size()); }
  int special(std::string_view name) const {
    for (std::size_t i = 0; i < specials_.size(); ++i)
      if (specials_[i] == name) return base_ + static_cast<int>(i);
    fail("tiktoken: no special token '{}'", name);
  }
  int bos() const { return special("<|begin_of_text|>"); }
  int eos() const { return special("<|end_of_text|>"); }
  int eot() const { return special("<|eot_id|>"); }

  /// Encodes text; special-token strings in it become their ids.
  std::vector<int> encode(std::string_view text, bool bos_first) const {
    std::vector<int> ids;
    if (bos_first) ids.push_back(bos());
    std::size_t start = 0, from = 0;
    for (;;) {
      // The next special token: a "<|...|>" that names one (one scan, whatever their number).
      const std::size_t open = text.find("<|", from);
      const std::size_t close = open == std::string_view::npos ? open : text.find("|>", open + 2);
      if (close == std::string_view::npos) break;
      const auto it = special_ids_.find(std::string(text.substr(open, close + 2 - open)));
      if (it == special_ids_.end()) {
        from = open + 2;
        continue;
      }
      encode_ordinary(text.substr(start, open - start), ids);
      ids.push_back(it->second);
      start = from = close + 2;
    }
    encode_ordinary(text.substr(start), ids);
    return ids;
  }

  /// The pre-tokenizer's pieces of ordinary text (no special tokens).
  std::vector<std::string> split(std::string_view text) const {
    std::vector<std::string> pieces;
    for_each_piece(text, [&](std::string_view p) { pieces.emplace_back(p); });
    return pieces;
  }

  std::string decode(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += decode(id);
    return out;
  }
  std::string decode(int id) const {
    KVD_EXPECT(id >= 0 && id < vocab(), "token id {} out of range [0, {})", id, vocab());
    return id < base_ ? pieces_[static_cast<std::size_t>(id)] : specials_[static_cast<std::size_t>(id - base_)];
  }

 private:
  struct CodeFree {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  struct DataFree {
    void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); }
  };

  void add_special(std::string s) {
    special_ids_.emplace(s, base_ + static_cast<int>(specials_.size()));
    specials_.push_back(std::move(s));
  }

  void encode_ordinary(std::string_view text, std::vector<int>& ids) const {
    for_each_piece(text, [&](std::string_view p) { bpe(p, ids); });
  }

  template <class F>
  void for_each_piece(std::string_view text, F&& f) const {
    if (text.empty()) return;
    std::unique_ptr<pcre2_match_data, DataFree> md(pcre2_match_data_create_from_pattern(re_.get(), nullptr));
    PCRE2_SIZE at = 0;
    while (at < text.size()) {
      // The first match checks the whole text is UTF-8; later ones need not check it again.
      const std::uint32_t options = at == 0 ? 0 : PCRE2_NO_UTF_CHECK;
      const int rc = pcre2_match(re_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, options, md.get(), nullptr);
      KVD_EXPECT(rc > 0, "tiktoken: the pre-tokenizer failed at byte {} (PCRE2 {}; invalid UTF-8?)", at, rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      KVD_EXPECT(ov[1] > ov[0], "tiktoken: empty pre-tokenizer match at byte {}", at);
      f(text.substr(ov[0], ov[1] - ov[0]));
      at = ov[1];
    }
  }

  /// Byte-level BPE of one piece: merge the adjacent pair of lowest rank while one exists.
  void bpe(std::string_view piece, std::vector<int>& ids) const {
    if (auto it = ranks_.find(std::string(piece)); it != ranks_.end()) {
      ids.push_back(it->second);
      return;
    }
    std::vector<std::string> parts;
    for (char c : piece) parts.emplace_back(1, c);
    for (;;) {
      int best = std::numeric_limits<int>::max();
      std::size_t at = 0;
      for (std::size_t i = 0; i + 1 < parts.size(); ++i)
        if (auto it = ranks_.find(parts[i] + parts[i + 1]); it != ranks_.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      if (best == std::numeric_limits<int>::max()) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<long>(at) + 1);
    }
    for (const auto& p : parts) {
      auto it = ranks_.find(p);
      KVD_EXPECT(it != ranks_.end(), "tiktoken: byte 0x{:02x} has no token (the vocabulary must hold all 256 bytes)",
                 static_cast<unsigned char>(p[0]));
      ids.push_back(it->second);
    }
  }

  static bool base64_decode(std::string_view in, std::string& out) {
    auto value = [](char c) -> int {
      if (c >= 'A' && c <= 'Z') return c - 'A';
      if (c >= 'a' && c <= 'z') return c - 'a' + 26;
      if (c >= '0' && c <= '9') return c - '0' + 52;
      if (c == '+') return 62;
      if (c == '/') return 63;
      return -1;
    };
    if (in.empty() || in.size() % 4 != 0) return false;
    out.clear();
    for (std::size_t i = 0; i < in.size(); i += 4) {
      int v[4];
      for (int k = 0; k < 4; ++k) {
        const char c = in[i + static_cast<std::size_t>(k)];
        v[k] = c == '=' ? (i + 4 == in.size() && k >= 2 ? 0 : -1) : value(c);
        if (v[k] < 0) return false;
      }
      const std::uint32_t n = static_cast<std::uint32_t>(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
      out += static_cast<char>(n >> 16);
      if (in[i + 2] != '=') out += static_cast<char>((n >> 8) & 0xff);
      if (in[i + 3] != '=') out += static_cast<char>(n & 0xff);
    }
    return true;
  }

  std::unordered_map<std::string, int> ranks_;
  std::vector<std::string> pieces_;
  std::vector<std::string> specials_;
  std::unordered_map<std::string, int> special_ids_;
  int base_ = 0;
  std::unique_ptr<pcre2_code, CodeFree> re_;
};

}  // namespace kvdrive::llama
