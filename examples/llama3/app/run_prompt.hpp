// kvd-llama's prompt: its text (--prompt, --prompt-file, a --needle task, in the chat template
// with --chat), its token ids, the tokenizer that makes them, the tokens that end generation, and
// whether a reply holds the expected answer.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat.hpp"
#include "kvdrive/core/error.hpp"
#include "model/model.hpp"
#include "app/needle.hpp"
#include "app/run_options.hpp"
#include "tokenizer/tokenizer.hpp"

namespace kvdrive::llama {

inline std::vector<int> parse_ids(const std::string& s, int vocab) {
  std::vector<int> ids;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok) {
    std::size_t used = 0;
    long v = 0;
    try {
      v = std::stol(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVD_EXPECT(used == tok.size(), "--prompt-ids: '{}' is not an integer token id", tok);
    KVD_EXPECT(v >= 0 && v < vocab, "--prompt-ids: token id {} out of range [0, {})", v, vocab);
    ids.push_back(static_cast<int>(v));
  }
  return ids;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVD_EXPECT(f.good(), "{}: cannot open", path);
  std::ostringstream s;
  s << f.rdbuf();
  KVD_EXPECT(!f.bad(), "{}: cannot read", path);
  return s.str();
}

/// The prompt's text before tokenizing: --prompt, --prompt-file or a --needle task, in the chat
/// template with --chat (or --needle).
struct PromptText {
  std::string text;
  bool special = false;      ///< special-token strings in the text are tokens (the chat template's)
  std::string reply_prefix;  ///< printed before the generated text
  std::string expect;        ///< what the reply must contain (empty: nothing checked)
  std::string what;          ///< a line for the log (empty: nothing to say)
};

inline PromptText prompt_text(const PromptOptions& o, const Model& m, const Tokenizer* tok) {
  KVD_EXPECT(o.text.empty() + o.file.empty() + (o.needle_tokens == 0) >= 2, "--prompt, --prompt-file and --needle exclude each other");
  PromptText p;
  p.expect = o.expect;
  p.reply_prefix = o.reply_prefix;
  bool chat = o.chat;
  if (!o.file.empty()) {
    p.text = read_text_file(o.file);
    KVD_EXPECT(!p.text.empty(), "--prompt-file {}: the file is empty", o.file);
  } else p.text = o.text;
  KVD_EXPECT(o.expect.empty() || tok != nullptr, "--expect checks the reply's text: it needs a tokenizer");
  if (o.needle_tokens > 0) {
    KVD_EXPECT(m.vocab != nullptr && !m.vocab->chat_template.empty(),
               "--needle asks its question in the model's chat template: {} has "
               "none (a GGUF model with tokenizer.chat_template)",
               m.source);
    KVD_EXPECT(tok != nullptr, "--needle needs a tokenizer (a GGUF model carries one)");
    const NeedleTask t = make_needle_task({o.needle_tokens, o.needle_depth, o.needle_seed},
                                          [&](const std::string& s) { return static_cast<std::int64_t>(tok->encode(s, false).size()); });
    if (o.question.empty()) {
      p.text = t.prompt;
      if (p.reply_prefix.empty()) p.reply_prefix = t.reply_prefix;
      if (p.expect.empty()) p.expect = t.answer;
    } else {  // the same document, another question
      p.text = t.prompt.substr(0, t.prompt.size() - t.question.size()) + o.question;
    }
    chat = true;
    p.what = fmt::format("needle: a {}-token document from {} ({} files), the number {} after its first {} tokens (depth {:.2f})", t.document_tokens,
                         NeedleSpec{}.dir, t.sources.size(), t.answer, t.needle_token,
                         static_cast<double>(t.needle_token) / static_cast<double>(std::max<std::int64_t>(1, t.document_tokens)));
  }
  KVD_EXPECT(!chat || !p.text.empty(), "--chat needs a prompt (--prompt, --prompt-file or --needle)");
  KVD_EXPECT(chat || (o.system.empty() && o.reply_prefix.empty()), "--system and --reply-prefix apply with --chat");
  if (chat) {
    KVD_EXPECT(m.vocab != nullptr, "--chat needs the model's chat template: a GGUF model ({} has none)", m.source);
    const ChatTemplate ct = ChatTemplate::from_gguf(m.vocab->chat_template);
    std::vector<ChatTurn> turns;
    if (!o.system.empty()) turns.push_back({"system", o.system});
    turns.push_back({"user", p.text});
    p.text = ct.render(std::move(turns), p.reply_prefix);
    p.special = true;
  }
  return p;
}

/// Whether `reply` holds `expect` as a whole: a number not run into other digits ("123456" does
/// not answer "12345").
inline bool reply_has(const std::string& reply, const std::string& expect) {
  const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  for (std::size_t at = reply.find(expect); at != std::string::npos; at = reply.find(expect, at + 1)) {
    const bool before = at > 0 && digit(reply[at - 1]) && digit(expect.front());
    const bool after = at + expect.size() < reply.size() && digit(reply[at + expect.size()]) && digit(expect.back());
    if (!before && !after) return true;
  }
  return false;
}

/// The prompt's ids: text (with a tokenizer), ids, a seeded synthetic prompt, or BOS alone.
inline std::vector<int> make_prompt(const PromptOptions& o, std::uint64_t seed, const LlamaConfig& c, const std::optional<Tokenizer>& tokenizer,
                                    const PromptText& text) {
  KVD_EXPECT(text.text.empty() || tokenizer, "a text prompt needs a tokenizer (--tokenizer, or a GGUF model), or give --prompt-ids");
  KVD_EXPECT(text.text.empty() || o.ids.empty(), "--prompt-ids excludes a text prompt");
  KVD_EXPECT(o.length == 0 || text.text.empty(),
             "--prompt-len pads an id prompt with random tokens; it excludes a text, chat or "
             "needle prompt");
  std::vector<int> prompt =
      tokenizer && !text.text.empty() ? tokenizer->encode(text.text, tokenizer->adds_bos(text.text), text.special) : parse_ids(o.ids, c.vocab);
  if (o.length > 0) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> tok(std::min(3, c.vocab - 1), c.vocab - 1);
    if (prompt.empty()) prompt.push_back(tokenizer && tokenizer->bos() >= 0 ? tokenizer->bos() : 1);
    while (static_cast<std::int64_t>(prompt.size()) < o.length) prompt.push_back(tok(rng));
  }
  if (prompt.empty()) {  // BOS alone
    KVD_EXPECT(!tokenizer || tokenizer->bos() >= 0, "the prompt is empty and the tokenizer has no BOS token to start from: give a prompt");
    prompt.push_back(tokenizer ? tokenizer->bos() : 1);
  }
  return prompt;
}

/// --tokenizer's file, else the model's own (GGUF), else none.
inline std::optional<Tokenizer> make_tokenizer(const ModelOptions& o, const Model& model) {
  std::optional<Tokenizer> t;
  if (!o.tokenizer.empty()) t.emplace(o.tokenizer, model.config.vocab);
  else if (model.vocab) t.emplace(*model.vocab);
  return t;
}

/// What a sequence decodes: the prompt's text (prompt_text) and its ids (make_prompt).
struct PromptInput {
  PromptText text;
  std::vector<int> ids;
};

inline PromptInput prompt_input(const RunOptions& o, const Model& model, const std::optional<Tokenizer>& tokenizer) {
  PromptInput in;
  in.text = prompt_text(o.prompt, model, tokenizer ? &*tokenizer : nullptr);
  in.ids = make_prompt(o.prompt, o.sampling.seed, model.config, tokenizer, in.text);
  return in;
}

/// The ids of the tokens that end generation: the tokenizer's, unless --ignore-eos.
inline std::vector<int> stop_tokens(const SamplingOptions& o, const std::optional<Tokenizer>& tokenizer) {
  std::vector<int> stops;
  if (tokenizer && !o.ignore_eos) stops = tokenizer->stops();
  return stops;
}

}  // namespace kvdrive::llama
