// The special tokens of the GGUF tokenizer, by llama.cpp's rules: EOT, EOM and the FIM tokens found
// by their text, the end-of-generation set, and the splitting of text around the special tokens
// it holds (found before anything else, longest text first).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer_token_table.hpp"

namespace kvdrive::llama::gguf_tokenizer_detail {

/// Whether s is one of list.
inline bool one_of(const std::string& s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), std::string_view(s)) != list.end();
}

/// The fill-in-the-middle tokens.
struct FimTokens {
  int pre = -1, suf = -1, mid = -1, pad = -1, rep = -1, sep = -1;
};

/// EOT and EOM (those not given already) and the FIM tokens, by their text; each found is marked
/// control.
inline FimTokens detect_by_text(TokenTable& t, int& eot, int& eom) {
  FimTokens fim;
  auto detect = [&](int& slot, const std::string& text, int id, std::initializer_list<std::string_view> list) {
    if (slot == -1 && one_of(text, list)) {
      slot = id;
      t.attr(id) |= kAttrControl;
    }
  };
  // One pass in the map's order, as llama.cpp's (the first candidate in that order wins).
  for (const auto& [text, id] : t.token_to_id) {
    detect(eot, text, id,
           {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
            "<\xEF\xBD\x9C"
            "end\xE2\x96\x81"
            "of\xE2\x96\x81"
            "sentence\xEF\xBD\x9C>",
            "<end_of_utterance>"});
    detect(eom, text, id, {"<|eom_id|>"});
    detect(fim.pre, text, id,
           {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
            "<\xEF\xBD\x9C"
            "fim\xE2\x96\x81"
            "begin\xEF\xBD\x9C>",
            "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
    detect(fim.suf, text, id,
           {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
            "<\xEF\xBD\x9C"
            "fim\xE2\x96\x81"
            "hole\xEF\xBD\x9C>",
            "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
    detect(fim.mid, text, id,
           {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
            "<\xEF\xBD\x9C"
            "fim\xE2\x96\x81"
            "end\xEF\xBD\x9C>",
            "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
    detect(fim.pad, text, id, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
    detect(fim.rep, text, id, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
    detect(fim.sep, text, id, {"<|file_sep|>"});
  }
  return fim;
}

/// Adds the tokens whose text is one of llama.cpp's end-of-generation list to eog, marked control.
inline void add_eog_by_text(TokenTable& t, std::set<int>& eog) {
  for (const auto& [text, id] : t.token_to_id) {
    if (one_of(text, {"<|eot_id|>",
                      "<|im_end|>",
                      "<|end|>",
                      "<|return|>",
                      "<|call|>",
                      "<|flush|>",
                      "<|calls|>",
                      "<end_of_turn>",
                      "<|endoftext|>",
                      "</s>",
                      "<|eom_id|>",
                      "<EOT>",
                      "_<EOT>",
                      "[EOT]",
                      "[EOS]",
                      "<|end_of_text|>",
                      "<end_of_utterance>",
                      "<eos>",
                      "<turn|>",
                      "<|tool_response>",
                      "<\xEF\xBD\x9C"
                      "end\xE2\x96\x81"
                      "of\xE2\x96\x81"
                      "sentence\xEF\xBD\x9C>",
                      "[e~["})) {
      eog.insert(id);
      t.attr(id) |= kAttrControl;
    }
  }
}

/// The tokens of eog that llama.cpp takes out again where other tokens say they are not the end.
inline void remove_eog_exceptions(TokenTable& t, std::set<int>& eog) {
  // <|end|> is no end of generation where <|return|> and <|call|> (or <|calls|> and <|flush|>) are.
  bool has_return = false, has_call = false, has_flush = false;
  int end_id = -1;
  for (int id : eog) {
    const std::string& s = t.text(id);
    if (s == "<|return|>") has_return = true;
    else if (s == "<|call|>" || s == "<|calls|>") has_call = true;
    else if (s == "<|flush|>") has_flush = true;
    else if (s == "<|end|>") end_id = id;
  }
  if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
    eog.erase(end_id);
    t.attr(end_id) = kAttrUserDefined;
  }
  // </s> is a normal token where <|tool_response> or <|plamo:eos|> is.
  bool normal_s_marker = false;
  int s_id = -1;
  for (int id : eog) {
    const std::string& s = t.text(id);
    if (s == "<|tool_response>" || s == "<|plamo:eos|>") normal_s_marker = true;
    else if (s == "</s>") s_id = id;
  }
  if (normal_s_marker && s_id >= 0) {
    eog.erase(s_id);
    t.attr(s_id) = kAttrNormal;
  }
}

/// llama.cpp's text rules for EOT, EOM, FIM and end-of-generation tokens: finds eot and eom where
/// not given, marks the tokens found control (or user-defined, normal), and gives the
/// end-of-generation tokens, ascending.
inline std::vector<int> find_end_of_generation(TokenTable& t, int eos, int& eot, int& eom) {
  const FimTokens fim = detect_by_text(t, eot, eom);
  std::set<int> eog;
  for (int id : {fim.pad, fim.rep, fim.sep})
    if (id >= 0) eog.insert(id);
  add_eog_by_text(t, eog);
  // gpt-oss's tokens that are always shown.
  for (const auto& [text, id] : t.token_to_id)
    if (one_of(text, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) t.attr(id) = kAttrUserDefined;
  for (int id : {eos, eot, eom})
    if (id >= 0) eog.insert(id);
  remove_eog_exceptions(t, eog);
  return {eog.begin(), eog.end()};
}

/// The special tokens matched in text, longest first (sorted as llama.cpp sorts them).
inline std::vector<int> special_tokens_longest_first(const TokenTable& t) {
  std::vector<int> ids;
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) ids.push_back(static_cast<int>(i));
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return t.text(a).size() > t.text(b).size(); });
  return ids;
}

/// A part of the text to tokenize: a special token, or a range of ordinary text.
struct Fragment {
  int token;  ///< a special token, or -1 for text
  std::size_t offset, length;
};

/// Splits text around the special tokens it holds: each special token in turn (longest first),
/// every occurrence in every text fragment left, left to right. Without parse_special only
/// user-defined tokens are found.
inline std::vector<Fragment> partition(std::string_view text, bool parse_special, const TokenTable& t,
                                       const std::vector<int>& special_longest_first) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const int id : special_longest_first) {
    const std::uint32_t a = t.attr(id);
    if (!parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
    const std::string& s = t.text(id);
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view part = text.substr(f.offset, f.length);
      std::size_t from = 0;
      for (std::size_t m; (m = part.find(s, from)) != std::string_view::npos; from = m + s.size()) {
        if (m > from) next.push_back({-1, f.offset + from, m - from});
        next.push_back({id, 0, 0});
        changed = true;
      }
      if (from < part.size()) next.push_back({-1, f.offset + from, part.size() - from});
    }
    if (changed) frags.swap(next);
  }
  return frags;
}

}  // namespace kvdrive::llama::gguf_tokenizer_detail
