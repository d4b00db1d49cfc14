// GgufTokenizer: the tokenizer that a GGUF file's tokenizer.ggml.* metadata describes, giving the
// ids llama.cpp gives (llama_tokenize), the pieces it gives (llama_token_to_piece) and its
// detokenized text (llama_detokenize), checked against llama.cpp by tests/test_gguf_tokenizer.cpp
// on the golden files scripts/make-tokenizer-golden.py writes.
//
// Two models:
//   "gpt2"  byte-level BPE. The text is split into words by the pre-tokenizer tokenizer.ggml.pre
//           names (below), each word's UTF-8 bytes are mapped to GPT-2's printable characters, and
//           adjacent parts merge, the pair of lowest rank (its index in tokenizer.ggml.merges)
//           first, the leftmost of equal ranks first; a part that is no token falls back to the
//           tokens of its single bytes (skipping those that are none, as llama.cpp does).
//   "llama" SentencePiece (SPM) with scores: spaces become U+2581, a space is put before the text
//           and after each special token (tokenizer.ggml.add_space_prefix, default true), adjacent
//           UTF-8 characters merge while their concatenation is a token, the highest score first,
//           and what forms no token is spelt with the byte tokens <0xXX>.
// Any other model ("bert", "t5", "rwkv", ...) is an error naming it.
//
// Pre-tokenizers: llama.cpp runs a list of regexes, each splitting the pieces of the one before
// (a match and the text between matches are pieces). The lists, by family (names as llama.cpp
// maps them; GgufTokenizer::regexes() gives a tokenizer's list, tokenizer_pre_names.hpp spells
// them):
//   default  "" or "default": the punctuation run, the gpt2 regex, \p{N}+, [0-9][0-9][0-9]
//   gpt2     "gpt-2", "phi-2", "mpt", "olmo", ...: the gpt2 regex
//   smollm   "smollm", "starcoder", "refact", "command-r", ...: \p{N}, then the gpt2 regex
//   llama3   "llama-bpe", "llama3", "dbrx", ...: the llama3 regex
//   qwen2    "qwen2", "stablelm2", "megrez", ...: the llama3 regex with \p{N} for \p{N}{1,3}
// An unknown name is an error listing the known ones (llama.cpp refuses it too; "gpt2" is not one).
// They are matched here by hand-written scanners over code points (as llama.cpp's own fast paths
// do for the gpt2, llama3 and qwen2 patterns), with llama.cpp's Unicode classes: \p{L}, \p{N},
// \p{P} from Unicode 15.1 (the table in tokenizer_unicode.hpp; scripts/make-tokenizer-golden.py
// --unicode-table rebuilds it) and \s as the White_Space property. Text that is not valid UTF-8 is
// read as llama.cpp reads it: a byte that starts no well-formed sequence becomes U+FFFD (lead and
// continuation bits are checked, not overlong forms or surrogates).
//
// Special tokens: control, user-defined and unknown tokens are found in the text before anything
// else, longest text first (llama.cpp's order); with parse_special false only user-defined ones are.
// BOS is added when add_special and tokenizer.ggml.add_bos_token (default: true for "llama" and
// the llama3 pre-tokenizers, false otherwise), EOS when add_special and add_eos_token. The
// end-of-generation set follows llama.cpp's rules: EOS, EOT and EOM, the FIM pad/repo/separator
// tokens, and tokens whose text is one of llama.cpp's list (<|im_end|>, <|eot_id|>, <|endoftext|>,
// <end_of_turn>, ...).
//
// Not mirrored: llama.cpp's per-model LSTRIP/RSTRIP attributes chosen by general.name (phi-3,
// modern-bert, jina-v2: not in the metadata this gets), and FIM/mask ids given by metadata keys
// GgufVocab does not carry (the FIM tokens are still found by their text, as llama.cpp does).
//
// This class holds the settings and puts the parts together; the parts live apart:
//   tokenizer_token_table.hpp     the tokens, scores and attributes read from GgufVocab
//   tokenizer_pre_names.hpp       tokenizer.ggml.pre names, their families and regexes
//   tokenizer_pre_split.hpp       the pre-tokenizer's scanners (tokenizer_unicode.hpp: classes, UTF-8)
//   tokenizer_bpe.hpp             byte-level BPE merges ("gpt2")
//   tokenizer_spm.hpp             SentencePiece merges ("llama")
//   tokenizer_special_tokens.hpp  special tokens in text, EOT/EOM/FIM, the end-of-generation set
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/gguf_vocab.hpp"
#include "kvdrive/core/error.hpp"
#include "tokenizer/tokenizer_bpe.hpp"
#include "tokenizer/tokenizer_pre_names.hpp"
#include "tokenizer/tokenizer_pre_split.hpp"
#include "tokenizer/tokenizer_special_tokens.hpp"
#include "tokenizer/tokenizer_spm.hpp"
#include "tokenizer/tokenizer_token_table.hpp"
#include "tokenizer/tokenizer_unicode.hpp"

namespace kvdrive::llama {

class GgufTokenizer {
 public:
  enum class Type { bpe, spm };

  /// Token attributes, with llama.cpp's values (llama_token_attr): kAttrUnknown, kAttrControl, ...
  using Attr = gguf_tokenizer_detail::TokenAttr;
  using enum gguf_tokenizer_detail::TokenAttr;

  explicit GgufTokenizer(GgufVocab v) : model_(std::move(v.model)), pre_(std::move(v.pre)), chat_template_(std::move(v.chat_template)) {
    using namespace gguf_tokenizer_detail;
    set_model();
    if (v.add_space_prefix) add_space_prefix_ = *v.add_space_prefix;
    table_ = read_token_table(v);
    if (type_ == Type::bpe) {
      ranks_ = read_merge_ranks(v.merges);
      byte_chars_ = byte_chars_utf8();
    }
    set_special_ids(v);
    eog_ = find_end_of_generation(table_, eos_, eot_, eom_);
    special_cache_ = special_tokens_longest_first(table_);
    if (type_ == Type::spm) byte_tokens_ = spm_byte_tokens(table_);
  }

  Type type() const { return type_; }
  const std::string& model() const { return model_; }
  /// tokenizer.ggml.pre as given (empty: llama.cpp's default pre-tokenizer).
  const std::string& pre() const { return pre_; }
  const std::string& chat_template() const { return chat_template_; }
  int n_tokens() const { return static_cast<int>(table_.size()); }
  const std::string& text(int id) const { return table_.tokens.at(index(id)); }
  float score(int id) const { return table_.scores.at(index(id)); }
  std::uint32_t attr(int id) const { return table_.attrs.at(index(id)); }
  bool is_control(int id) const { return (attr(id) & kAttrControl) != 0; }

  /// The id of the token whose text is exactly `piece` (as stored: GPT-2 characters for BPE, ▁ for SPM).
  std::optional<int> token_id(std::string_view piece) const {
    const auto it = table_.token_to_id.find(std::string(piece));
    if (it == table_.token_to_id.end()) return std::nullopt;
    return it->second;
  }

  /// Special ids (-1: none).
  int bos() const { return bos_; }
  int eos() const { return eos_; }
  int eot() const { return eot_; }
  int eom() const { return eom_; }
  int unk() const { return unk_; }
  int pad() const { return pad_; }
  int sep() const { return sep_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  bool clean_spaces() const { return clean_spaces_; }
  bool ignore_merges() const { return ignore_merges_; }
  /// llama.cpp's pre-tokenizer regexes for this tokenizer, in the order they split (BPE; none for SPM).
  std::vector<std::string_view> regexes() const {
    if (type_ == Type::spm) return {};
    return gguf_tokenizer_detail::pre_regexes(family_);
  }
  /// The end-of-generation tokens, ascending.
  const std::vector<int>& eog() const { return eog_; }
  bool is_eog(int id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

  /// llama_tokenize: BOS first when add_special and add_bos(), EOS last when add_special and
  /// add_eos(); with parse_special, control and unknown token texts in `text` are their tokens
  /// (user-defined ones always are).
  std::vector<int> tokenize(std::string_view text, bool add_special, bool parse_special) const {
    std::vector<int> out;
    const std::vector<Fragment> frags = gguf_tokenizer_detail::partition(text, parse_special, table_, special_cache_);
    if (add_special && add_bos_) {
      KVD_EXPECT(bos_ >= 0, "the tokenizer adds BOS but has no BOS token");
      out.push_back(bos_);
    }
    if (type_ == Type::spm) spm_fragments(text, frags, out);
    else bpe_fragments(text, frags, out);
    if (add_special && add_eos_) {
      KVD_EXPECT(eos_ >= 0, "the tokenizer adds EOS but has no EOS token");
      out.push_back(eos_);
    }
    return out;
  }

  /// The pre-tokenizer's words of ordinary text (BPE only), as UTF-8 (invalid bytes read as U+FFFD).
  std::vector<std::string> pretokenize(std::string_view text) const {
    KVD_EXPECT(type_ == Type::bpe, "pretokenize: a '{}' tokenizer has no pre-tokenizer", model_);
    std::vector<std::string> words;
    gguf_tokenizer_detail::for_each_word(text, family_, [&](std::string&& w) { words.push_back(std::move(w)); });
    return words;
  }

  /// llama_token_to_piece(id, lstrip, special): the text of one token. Control and unknown tokens
  /// are empty unless `special`; lstrip drops one leading space.
  std::string token_to_piece(int id, bool special = false, bool lstrip = false) const {
    const std::uint32_t a = attr(id);
    if (!special && (a & (kAttrUnknown | kAttrControl))) return {};
    std::string p = piece_of(id);
    if (lstrip && !p.empty() && p[0] == ' ') p.erase(0, 1);
    return p;
  }

  /// llama_detokenize(ids, remove_special, unparse_special).
  std::string detokenize(const std::vector<int>& ids, bool remove_special = false, bool unparse_special = false) const {
    std::size_t first = 0, last = ids.size();
    bool remove_space = add_space_prefix_;
    if (remove_special && add_bos_ && last > first && ids[first] == bos_) {
      remove_space = false;
      ++first;
    }
    if (remove_special && add_eos_ && last > first && ids[last - 1] == eos_) --last;
    std::string text;
    for (std::size_t i = first; i < last; ++i) {
      text += token_to_piece(ids[i], unparse_special, remove_space);
      remove_space = false;
    }
    if (clean_spaces_) text = clean_up_spaces(std::move(text));
    return text;
  }

 private:
  using Fragment = gguf_tokenizer_detail::Fragment;

  std::size_t index(int id) const {
    KVD_EXPECT(id >= 0 && static_cast<std::size_t>(id) < table_.size(), "token id {} out of range [0, {})", id, table_.size());
    return static_cast<std::size_t>(id);
  }

  /// The model's type and defaults: "gpt2" with its pre-tokenizer's settings, or "llama".
  void set_model() {
    using namespace gguf_tokenizer_detail;
    if (model_ == "gpt2") {
      type_ = Type::bpe;
      bos_ = 11, eos_ = 11, unk_ = -1;  // llama.cpp's defaults for BPE
      clean_spaces_ = true;
      if (pre_.empty()) {
        family_ = PreFamily::default_;
      } else {
        const PreName& found = find_pre_name(pre_);
        family_ = found.family;
        clean_spaces_ = found.clean_spaces;
        ignore_merges_ = found.ignore_merges;
        add_bos_ = found.add_bos;
      }
    } else if (model_ == "llama") {
      type_ = Type::spm;
      bos_ = 1, eos_ = 2, unk_ = 0;
      add_space_prefix_ = true;
      add_bos_ = true;
    } else {
      fail("tokenizer model '{}' (tokenizer.ggml.model) is not supported: only 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)", model_);
    }
  }

  /// Special ids: the metadata's when in range, else the default (disabled when out of range).
  void set_special_ids(const GgufVocab& v) {
    const std::size_t n = table_.size();
    auto special = [&](int& id, const std::optional<std::int32_t>& given) {
      if (id >= 0 && static_cast<std::size_t>(id) >= n) id = -1;
      if (given && *given >= 0 && static_cast<std::size_t>(*given) < n) id = *given;
    };
    special(bos_, v.bos);
    special(eos_, v.eos);
    special(eot_, v.eot);
    special(eom_, v.eom);
    special(unk_, v.unk);
    special(sep_, v.sep);
    special(pad_, v.pad);
    if (v.add_bos) add_bos_ = *v.add_bos;
    if (v.add_eos) add_eos_ = *v.add_eos;
  }

  /// SentencePiece: a space before the text and after each special token (add_space_prefix),
  /// spaces escaped, each text fragment merged.
  void spm_fragments(std::string_view text, const std::vector<Fragment>& frags, std::vector<int>& out) const {
    bool prev_special = true;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      std::string s;
      if (add_space_prefix_ && prev_special) s = " ";
      s += text.substr(f.offset, f.length);
      gguf_tokenizer_detail::spm_merge(gguf_tokenizer_detail::escape_spaces(s), table_, byte_tokens_, out);
      prev_special = false;
    }
  }

  /// Byte-level BPE: each text fragment's words, their bytes as GPT-2 characters, merged (once
  /// per distinct word).
  void bpe_fragments(std::string_view text, const std::vector<Fragment>& frags, std::vector<int>& out) const {
    std::unordered_map<std::string, std::vector<int>> cache;
    for (const Fragment& f : frags) {
      if (f.token >= 0) out.push_back(f.token);
      else bpe_fragment(text.substr(f.offset, f.length), cache, out);
    }
  }

  /// Byte-level BPE of one text fragment.
  void bpe_fragment(std::string_view text, std::unordered_map<std::string, std::vector<int>>& cache, std::vector<int>& out) const {
    gguf_tokenizer_detail::for_each_word(text, family_, [&](std::string&& w) {
      std::string mapped;
      mapped.reserve(w.size() * 2);
      for (const char c : w) mapped += byte_chars_[static_cast<unsigned char>(c)];
      auto [it, fresh] = cache.try_emplace(mapped);
      if (fresh) bpe_word(mapped, it->second);
      out.insert(out.end(), it->second.begin(), it->second.end());
    });
  }

  void bpe_word(const std::string& word, std::vector<int>& out) const {
    if (ignore_merges_)
      if (auto it = table_.token_to_id.find(word); it != table_.token_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    gguf_tokenizer_detail::bpe_merge_word(word, ranks_, table_, out);
  }

  /// The piece of a token when shown (llama.cpp's token_to_piece with special = true).
  std::string piece_of(int id) const {
    const std::size_t i = index(id);
    const std::uint32_t a = table_.attrs[i];
    const std::string& t = table_.tokens[i];
    if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return t;
    if (a & kAttrNormal) return type_ == Type::spm ? gguf_tokenizer_detail::spm_piece(t) : gguf_tokenizer_detail::bpe_piece(t);
    if (a & kAttrByte) {
      const std::string hex = t.size() > 3 ? t.substr(3, 2) : std::string();
      return std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }
    return {};  // unused and undefined tokens show nothing
  }

  /// llama.cpp's clean-up of detokenized text (clean_spaces): " ?", " !", " .", " ," lose the
  /// space; " ' " becomes "'"; " 's", " 'm", " 're", " 've" lose the space. Done in place, as
  /// llama.cpp does, so a pass sees what the one before left.
  static std::string clean_up_spaces(std::string text) {
    auto pass = [&text](auto&& step) {
      const std::size_t n = text.size();
      if (n == 0) return;
      std::size_t total = 1;
      for (std::size_t i = 1; i < n; ++i) step(i, total, n);
      text.resize(total);
    };
    pass([&](std::size_t& i, std::size_t& total, std::size_t) {
      const char x = text[i];
      if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
      text[total++] = x;
    });
    pass([&](std::size_t& i, std::size_t& total, std::size_t n) {
      const char x = text[i];
      if (x == '\'' && i + 1 < n && text[i - 1] == ' ' && text[i + 1] == ' ') {
        --total;
        text[++i] = '\0';
      }
      text[total++] = x;
    });
    pass([&](std::size_t& i, std::size_t& total, std::size_t n) {
      const char x = text[i];
      if (text[i - 1] == ' ' && x == '\'' && i + 1 < n) {
        const char x1 = text[i + 1];
        if (x1 == 's' || x1 == 'm') --total;
        else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
          const char x2 = text[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
        }
      }
      text[total++] = x;
    });
    return text;
  }

  Type type_ = Type::bpe;
  std::string model_, pre_, chat_template_;
  gguf_tokenizer_detail::PreFamily family_ = gguf_tokenizer_detail::PreFamily::default_;
  bool add_space_prefix_ = false, add_bos_ = false, add_eos_ = false, clean_spaces_ = false, ignore_merges_ = false;
  int bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1, sep_ = -1, pad_ = -1;
  gguf_tokenizer_detail::TokenTable table_;
  gguf_tokenizer_detail::MergeRanks ranks_;  ///< BPE: "left right" -> merge rank
  std::array<std::string, 256> byte_chars_;  ///< BPE: byte -> its GPT-2 character (UTF-8)
  std::array<int, 256> byte_tokens_{};       ///< SPM: byte -> <0xXX> token
  std::vector<int> special_cache_;           ///< the special tokens matched in text, longest first
  std::vector<int> eog_;
};

}  // namespace kvdrive::llama
