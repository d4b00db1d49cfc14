// A needle in a haystack of real text: the task `make demo` asks SmolLM2. The haystack is the
// licence texts every Debian machine has (/usr/share/common-licenses), paragraph by paragraph in
// a fixed order, cut at a token budget; one sentence with a seeded five-digit number (RULER's
// wording: "One of the special magic numbers is: N.") goes in between two paragraphs at a chosen
// depth, and the question asks for it. The reply is begun for the model, as RULER does, so the
// answer is the next few tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

struct NeedleTask {
  std::string prompt;                ///< instruction, document and question: the user's turn
  std::string question;              ///< the question: the end of prompt
  std::string reply_prefix;          ///< the start of the assistant's reply
  std::string answer;                ///< the number the reply must contain
  std::int64_t document_tokens = 0;  ///< tokens of the document (haystack and needle)
  std::int64_t needle_token = 0;     ///< tokens of the document before the needle
  std::vector<std::string> sources;  ///< the files the haystack was taken from
};

struct NeedleSpec {
  std::int64_t tokens = 4000;  ///< document length in tokens (at most; cut at a paragraph)
  double depth = 0.5;          ///< where the needle goes, as a fraction of the document
  std::uint64_t seed = 1;      ///< picks the number
  std::string dir = "/usr/share/common-licenses";
};

/// The paragraphs of the licence texts in `dir`: regular files (not links: Debian links GPL to
/// GPL-3) in name order, split at blank lines, whitespace inside a paragraph joined to one space.
inline std::vector<std::string> haystack_paragraphs(const std::string& dir, std::vector<std::string>* sources = nullptr) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  KVD_EXPECT(!ec, "{}: cannot list: {}", dir, ec.message());
  KVD_EXPECT(!files.empty(), "{}: no text files for the haystack", dir);
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const auto& f : files) {
    std::ifstream in(f);
    if (!in) continue;
    if (sources) sources->push_back(f.filename().string());
    std::string line, para;
    const auto flush = [&] {
      if (!para.empty()) out.push_back(std::move(para));
      para.clear();
    };
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string w;
      bool any = false;
      while (words >> w) {
        if (!para.empty()) para += ' ';
        para += w;
        any = true;
      }
      if (!any) flush();
    }
    flush();
  }
  return out;
}

/// The task for `spec`; count_tokens(text) is the model's tokenizer's count for a text.
inline NeedleTask make_needle_task(const NeedleSpec& spec, const std::function<std::int64_t(const std::string&)>& count_tokens) {
  KVD_EXPECT(spec.tokens >= 64, "needle: a document of {} tokens is too short (at least 64)", spec.tokens);
  KVD_EXPECT(spec.depth >= 0 && spec.depth <= 1, "needle: depth {} outside [0, 1]", spec.depth);
  NeedleTask t;
  std::mt19937_64 rng(spec.seed);
  t.answer = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(rng));
  const std::string needle = "One of the special magic numbers is: " + t.answer + ".";
  const std::int64_t needle_tokens = count_tokens("\n\n" + needle);

  // Paragraphs until the budget (less the needle's tokens) is spent.
  std::vector<std::string> paras = haystack_paragraphs(spec.dir, &t.sources);
  std::vector<std::int64_t> cost;
  std::int64_t total = 0;
  std::size_t n = 0;
  for (; n < paras.size(); ++n) {
    const std::int64_t c = count_tokens((n ? "\n\n" : "") + paras[n]);
    if (total + c + needle_tokens > spec.tokens) break;
    cost.push_back(c);
    total += c;
  }
  KVD_EXPECT(n > 0, "needle: the first paragraph of {} alone exceeds {} tokens", spec.dir, spec.tokens);
  KVD_EXPECT(n < paras.size() || total + needle_tokens >= spec.tokens * 9 / 10, "needle: {} holds only {} tokens of text, fewer than the {} asked",
             spec.dir, total, spec.tokens);
  // The needle goes at the paragraph boundary nearest to depth x total tokens.
  const auto want = static_cast<std::int64_t>(spec.depth * static_cast<double>(total));
  std::size_t at = 0;
  std::int64_t before = 0;
  while (at < n && before + cost[at] / 2 < want) before += cost[at++];
  std::string doc;
  for (std::size_t i = 0; i <= n; ++i) {
    if (i == at) {
      if (!doc.empty()) doc += "\n\n";
      doc += needle;
    }
    if (i == n) break;
    doc += "\n\n";
    doc += paras[i];
  }
  if (doc.rfind("\n\n", 0) == 0) doc.erase(0, 2);
  t.document_tokens = total + needle_tokens;
  t.needle_token = before;
  t.question = "What is the special magic number mentioned in the provided text?";
  t.prompt =
      "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about "
      "the numbers afterwards.\n" +
      doc + "\n" + t.question;
  t.reply_prefix = "The special magic number mentioned in the provided text is";
  return t;
}

}  // namespace kvdrive::llama
