// The llama2.c tokenizer (tokenizer.bin): a SentencePiece-style vocabulary with a score per
// piece. File: int32 max_token_length, then per token: float32 score, int32 length, bytes.
// Encoding: a dummy-prefix space, UTF-8 characters looked up whole (bytes fall back to the
// <0xXX> tokens at ids 3..258), then pairs merged greedily by the best score of the merged piece.
// Decoding strips the space after BOS and turns <0xXX> pieces back into raw bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "model/mapped_file.hpp"

namespace kvdrive::llama {

class Llama2cTokenizer {
 public:
  static constexpr int kBos = 1, kEos = 2, kFirstByteToken = 3;

  /// vocab: the model's vocabulary size (the file does not record it).
  Llama2cTokenizer(const std::string& path, int vocab) {
    MappedFile f(path);
    const std::byte* p = f.data();
    const std::byte* end = p + f.size();
    auto read = [&](void* dst, std::size_t n, const char* what, int token) {
      KVD_EXPECT(static_cast<std::size_t>(end - p) >= n, "{}: truncated at token {} ({}); the model has {} tokens", path, token, what, vocab);
      std::memcpy(dst, p, n);
      p += n;
    };
    KVD_EXPECT(vocab >= kFirstByteToken + 256, "{}: vocabulary size {} is too small for <unk>, <s>, </s> and the 256 byte tokens", path, vocab);
    std::int32_t max_len = 0;
    read(&max_len, 4, "max_token_length", -1);
    KVD_EXPECT(max_len > 0 && max_len < 65536, "{}: max_token_length {} is implausible", path, max_len);
    pieces_.resize(static_cast<std::size_t>(vocab));
    scores_.resize(static_cast<std::size_t>(vocab));
    for (int i = 0; i < vocab; ++i) {
      std::int32_t len = 0;
      read(&scores_[static_cast<std::size_t>(i)], 4, "score", i);
      read(&len, 4, "length", i);
      KVD_EXPECT(len >= 0 && len <= max_len, "{}: token {} has length {} (max_token_length {})", path, i, len, max_len);
      pieces_[static_cast<std::size_t>(i)].resize(static_cast<std::size_t>(len));
      read(pieces_[static_cast<std::size_t>(i)].data(), static_cast<std::size_t>(len), "bytes", i);
      ids_.emplace(pieces_[static_cast<std::size_t>(i)], i);  // the first id wins on duplicates
    }
  }

  int vocab() const { return static_cast<int>(pieces_.size()); }
  const std::string& piece(int id) const { return pieces_.at(static_cast<std::size_t>(id)); }

  std::vector<int> encode(std::string_view text, bool bos) const {
    std::vector<int> ids;
    if (bos) ids.push_back(kBos);
    if (text.empty()) return ids;
    std::vector<int> t;
    if (auto it = ids_.find(" "); it != ids_.end()) t.push_back(it->second);  // dummy prefix
    for (std::size_t i = 0; i < text.size();) {
      std::size_t n = 1;  // one UTF-8 character: a lead byte and its continuation bytes
      while (i + n < text.size() && n < 4 && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
      auto it = ids_.find(std::string(text.substr(i, n)));
      if (it != ids_.end()) {
        t.push_back(it->second);
      } else {
        for (std::size_t b = 0; b < n; ++b) t.push_back(kFirstByteToken + static_cast<unsigned char>(text[i + b]));
      }
      i += n;
    }
    for (;;) {  // merge the pair whose merged piece scores best (leftmost on ties)
      float best = -1e30f;
      int best_id = -1;
      std::size_t at = 0;
      for (std::size_t i = 0; i + 1 < t.size(); ++i) {
        auto it = ids_.find(piece(t[i]) + piece(t[i + 1]));
        if (it != ids_.end() && scores_[static_cast<std::size_t>(it->second)] > best) {
          best = scores_[static_cast<std::size_t>(it->second)];
          best_id = it->second;
          at = i;
        }
      }
      if (best_id < 0) break;
      t[at] = best_id;
      t.erase(t.begin() + static_cast<long>(at) + 1);
    }
    ids.insert(ids.end(), t.begin(), t.end());
    return ids;
  }

  /// The text of `id` following `prev`.
  std::string decode(int prev, int id) const {
    KVD_EXPECT(id >= 0 && id < vocab(), "token id {} out of range [0, {})", id, vocab());
    std::string_view s = piece(id);
    if (prev == kBos && !s.empty() && s[0] == ' ') s.remove_prefix(1);
    unsigned byte = 0;
    if (s.size() == 6 && s.substr(0, 3) == "<0x" && s[5] == '>' && std::sscanf(std::string(s).c_str(), "<0x%02X>", &byte) == 1)
      return std::string(1, static_cast<char>(byte));
    return std::string(s);
  }

  std::string decode(const std::vector<int>& ids, int prev = -1) const {
    std::string out;
    for (int id : ids) {
      out += decode(prev, id);
      prev = id;
    }
    return out;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
};

}  // namespace kvdrive::llama
