// kvd-longbench's tasks: long-context retrieval in the style of RULER (Hsieh et al., 2024), over
// real prose. Each task is a document (a haystack with sentences planted in it at chosen depths)
// inside RULER's instruction and question, and the answers the reply must hold:
//
//   niah-number  one key, one 7-digit value ("One of the special magic numbers for K is: V.")
//   niah-word    one key, one word value
//   multikey     four keys with a number each; the question asks for one (three distractors)
//   multivalue   one key with four numbers; the reply must hold all four
//   vt           variable tracking: a chain "VAR A = N", "VAR B = VAR A", ... of five variables
//                spread over the document; the reply must name all five
//
// Haystacks: the licence texts of /usr/share/common-licenses, paragraph by paragraph, starting at a
// paragraph the sample's seed picks (so samples do not share one document), or, as a control,
// RULER's repeated "noise" sentences. A task's context length counts every token of the prompt
// (chat template included) and the reply's new tokens, so an 8K task fits the model's 8,192.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"
#include "app/needle.hpp"

namespace kvdrive::longbench {

enum class TaskKind { niah_number, niah_word, multikey, multivalue, vt };
enum class Haystack { prose, repeat };

inline constexpr std::array<TaskKind, 5> kAllTasks = {TaskKind::niah_number, TaskKind::niah_word, TaskKind::multikey, TaskKind::multivalue,
                                                      TaskKind::vt};

inline std::string_view task_name(TaskKind k) {
  switch (k) {
    case TaskKind::niah_number: return "niah-number";
    case TaskKind::niah_word: return "niah-word";
    case TaskKind::multikey: return "multikey";
    case TaskKind::multivalue: return "multivalue";
    case TaskKind::vt: return "vt";
  }
  return "?";
}

inline TaskKind parse_task(std::string_view s) {
  for (TaskKind k : kAllTasks)
    if (task_name(k) == s) return k;
  throw Error(fmt::format("unknown task '{}' (niah-number, niah-word, multikey, multivalue, vt)", s));
}

inline std::string_view haystack_name(Haystack h) { return h == Haystack::prose ? "prose" : "repeat"; }

/// New tokens the reply may take: enough for the answers and a few words around them.
inline int reply_tokens(TaskKind k) {
  switch (k) {
    case TaskKind::multivalue: return 40;
    case TaskKind::vt: return 32;
    case TaskKind::niah_word: return 12;
    default: return 16;
  }
}

struct TaskSpec {
  TaskKind kind = TaskKind::niah_number;
  Haystack haystack = Haystack::prose;
  std::int64_t context = 1024;  ///< prompt tokens (chat template included) + reply_tokens(kind), at most
  double depth = 0.5;           ///< where the needle goes (vt, multivalue: the first of them), fraction of the document
  std::uint64_t seed = 1;       ///< picks keys, values, distractor depths and the haystack's first paragraph
};

struct Task {
  TaskSpec spec;
  std::string user;                  ///< the user's turn: instruction, document, question
  std::string reply_prefix;          ///< the reply is begun for the model, as RULER does
  std::vector<std::string> answers;  ///< every one must be in the reply
  std::int64_t document_tokens = 0;  ///< tokens of the document
};

/// count(user, reply_prefix): the tokens of the rendered prompt (template, BOS included).
using PromptTokens = std::function<std::int64_t(const std::string&, const std::string&)>;

namespace detail {

// Word lists for keys and values, written for this benchmark.
inline constexpr std::array<std::string_view, 40> kAdjectives = {
    "amber", "brisk",  "calm",   "dusty",  "eager",  "faint",  "gentle", "hollow", "icy",    "jolly", "keen",  "lively", "mellow", "narrow",
    "olive", "proud",  "quiet",  "rapid",  "silent", "tidy",   "upper",  "vivid",  "wary",   "young", "zesty", "bold",   "crisp",  "damp",
    "early", "fierce", "golden", "humble", "inner",  "jagged", "kind",   "lucky",  "modest", "noble", "plain", "rustic"};
inline constexpr std::array<std::string_view, 40> kNouns = {
    "anchor",  "basket", "candle",  "desert", "engine", "falcon", "garden",   "harbor",  "island", "jacket", "kettle", "ladder", "meadow", "needle",
    "orchard", "pepper", "quarry",  "river",  "saddle", "tunnel", "umbrella", "valley",  "wagon",  "yarrow", "zipper", "bridge", "cabin",  "dolphin",
    "ember",   "forest", "glacier", "hammer", "ivory",  "jungle", "kernel",   "lantern", "mirror", "nutmeg", "oyster", "parrot"};

/// The repeated-sentence haystack (RULER's "noise").
inline constexpr std::string_view kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

template <class Rng>
std::string pick(Rng& rng, std::span<const std::string_view> words) {
  return std::string(words[std::uniform_int_distribution<std::size_t>(0, words.size() - 1)(rng)]);
}

template <class Rng>
std::string number(Rng& rng) {
  return std::to_string(std::uniform_int_distribution<int>(1000000, 9999999)(rng));
}

template <class Rng>
std::string variable(Rng& rng) {
  std::string s(5, 'A');
  for (char& c : s) c = static_cast<char>('A' + std::uniform_int_distribution<int>(0, 25)(rng));
  return s;
}

/// `n` distinct values from make().
template <class Make>
std::vector<std::string> distinct(std::size_t n, Make make) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  while (out.size() < n)
    if (std::string s = make(); seen.insert(s).second) out.push_back(std::move(s));
  return out;
}

/// A planted sentence and where it goes.
struct Needle {
  std::string text;
  double depth;
};

/// The haystack's units (paragraphs, or sentences of noise), starting at a seeded paragraph.
inline std::vector<std::string> haystack_units(Haystack h, std::uint64_t seed) {
  if (h == Haystack::repeat) return std::vector<std::string>(4096, std::string(kNoise));
  static const std::vector<std::string> paras = llama::haystack_paragraphs(llama::NeedleSpec{}.dir);
  std::vector<std::string> units;
  const std::size_t first = static_cast<std::size_t>(seed % paras.size());
  for (std::size_t i = 0; i < paras.size(); ++i) units.push_back(paras[(first + i) % paras.size()]);
  return units;
}

/// The document: units until `budget` tokens (less the needles'), each needle at the unit boundary
/// nearest its depth; `tokens` counts a text's tokens. Returns the document and its token count.
inline std::pair<std::string, std::int64_t> build_document(const std::vector<std::string>& units, std::vector<Needle> needles, std::int64_t budget,
                                                           const std::function<std::int64_t(const std::string&)>& tokens) {
  std::int64_t needle_cost = 0;
  for (const auto& n : needles) needle_cost += tokens("\n\n" + n.text);
  // Units in order until the next one does not fit. Where that leaves the document short of 80%
  // of its budget (a long licence section came next), units that do not fit are passed over
  // instead, so that a seed never leaves a sample without its document.
  std::vector<std::int64_t> cost;
  std::vector<std::string> kept;
  std::int64_t total = 0;
  for (const bool pass_over : {false, true}) {
    cost.clear(), kept.clear(), total = 0;
    for (std::size_t i = 0; i < units.size(); ++i) {
      const std::int64_t c = tokens((kept.empty() ? "" : "\n\n") + units[i]);
      if (total + c + needle_cost > budget) {
        if (pass_over) continue;
        break;
      }
      cost.push_back(c);
      kept.push_back(units[i]);
      total += c;
    }
    if (total + needle_cost >= budget * 8 / 10) break;
  }
  KVD_EXPECT(total + needle_cost >= budget * 8 / 10, "longbench: the haystack holds {} tokens, too few for a {}-token document", total, budget);
  std::stable_sort(needles.begin(), needles.end(), [](const Needle& a, const Needle& b) { return a.depth < b.depth; });
  std::string doc;
  std::size_t next = 0;
  std::int64_t before = 0;
  for (std::size_t i = 0; i <= cost.size(); ++i) {
    // Needles whose depth falls before the middle of unit i go in front of it.
    const double mid = i < cost.size() ? static_cast<double>(before + cost[i] / 2) : 1e300;
    for (; next < needles.size() && needles[next].depth * static_cast<double>(total) <= mid; ++next)
      doc += (doc.empty() ? "" : "\n\n") + needles[next].text;
    if (i == cost.size()) break;
    doc += (doc.empty() ? "" : "\n\n") + kept[i];
    before += cost[i];
  }
  return {doc, total + needle_cost};
}

/// The variable-tracking task's needles (a chain of assignments from `depth` on), answers, head,
/// question and reply prefix, drawn from rng.
inline void variable_tracking(const TaskSpec& spec, std::mt19937_64& rng, Task& t, std::vector<Needle>& needles, std::string& head,
                              std::string& question) {
  std::uniform_real_distribution<double> anywhere(0.0, 1.0);
  const std::string value = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(rng));
  const std::vector<std::string> vars = distinct(5, [&] { return variable(rng); });
  // The chain in order through the document, from `depth` on (RULER spreads it at random depths).
  std::vector<double> at = {spec.depth};
  for (std::size_t i = 1; i < vars.size(); ++i) at.push_back(spec.depth + (1 - spec.depth) * anywhere(rng));
  std::sort(at.begin(), at.end());
  for (std::size_t i = 0; i < vars.size(); ++i)
    needles.push_back({fmt::format("VAR {} = {}.", vars[i], i == 0 ? value : "VAR " + vars[i - 1]), at[i]});
  t.answers = vars;
  head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
  question = fmt::format("\nQuestion: Find all variables that are assigned the value {} in the text above.", value);
  t.reply_prefix = fmt::format(
      "Answer: According to the chain(s) of variable assignment in the text above, {} variables are "
      "assigned the value {}, they are:",
      vars.size(), value);
}

}  // namespace detail

/// The task for `spec`. count(user, reply_prefix) counts the rendered prompt; tokens(text) a
/// piece of text.
inline Task make_task(const TaskSpec& spec, const PromptTokens& count, const std::function<std::int64_t(const std::string&)>& tokens) {
  KVD_EXPECT(spec.context >= 256, "longbench: a context of {} tokens is too short (at least 256)", spec.context);
  KVD_EXPECT(spec.depth >= 0 && spec.depth <= 1, "longbench: depth {} outside [0, 1]", spec.depth);
  using namespace detail;
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(spec.kind) + 1);
  std::uniform_real_distribution<double> anywhere(0.0, 1.0);
  const auto key = [&] { return pick(rng, kAdjectives) + "-" + pick(rng, kNouns); };
  Task t;
  t.spec = spec;
  std::vector<Needle> needles;
  std::string head, question;
  const std::string what = spec.kind == TaskKind::niah_word ? "words" : "numbers";
  if (spec.kind == TaskKind::vt) {
    variable_tracking(spec, rng, t, needles, head, question);
  } else {
    const std::size_t keys = spec.kind == TaskKind::multikey ? 4 : 1;
    const std::size_t values = spec.kind == TaskKind::multivalue ? 4 : 1;
    const std::vector<std::string> names = distinct(keys, key);
    for (std::size_t k = 0; k < keys; ++k) {
      const std::vector<std::string> vs = distinct(values, [&] { return spec.kind == TaskKind::niah_word ? pick(rng, kNouns) : number(rng); });
      for (std::size_t v = 0; v < values; ++v) {
        const bool target = k == 0;
        const double d = target && v == 0 ? spec.depth : anywhere(rng);
        needles.push_back({fmt::format("One of the special magic {} for {} is: {}.", what, names[k], vs[v]), d});
        if (target) t.answers.push_back(vs[v]);
      }
    }
    head = fmt::format(
        "Some special magic {0} are hidden within the following text. Make sure to memorize it. I will quiz you about "
        "the {0} afterwards.\n",
        what);
    question = fmt::format("\nWhat are all the special magic {} for {} mentioned in the provided text?", what, names[0]);
    t.reply_prefix = fmt::format("The special magic {} for {} mentioned in the provided text are", what, names[0]);
  }
  // The document gets what the prompt and the reply leave of the context; a few tokens spare for
  // the joins, then shrink until the rendered prompt fits.
  const std::int64_t frame = count(head + question, t.reply_prefix);
  std::int64_t budget = spec.context - reply_tokens(spec.kind) - frame - 4;
  const std::vector<std::string> units = haystack_units(spec.haystack, spec.seed);
  for (;;) {
    KVD_EXPECT(budget >= 64, "longbench: a {}-token context leaves no room for a document", spec.context);
    auto [doc, doc_tokens] = build_document(units, needles, budget, tokens);
    t.user = head + doc + question;
    t.document_tokens = doc_tokens;
    const std::int64_t over = count(t.user, t.reply_prefix) + reply_tokens(spec.kind) - spec.context;
    if (over <= 0) return t;
    budget -= over + 8;
  }
}

/// The fraction of the task's answers the reply holds (a number as a whole number, a word or
/// variable as a whole word, case-sensitive as written).
inline double score(const Task& t, const std::string& reply) {
  const auto alnum = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  const auto holds = [&](const std::string& a) {
    for (std::size_t at = reply.find(a); at != std::string::npos; at = reply.find(a, at + 1))
      if ((at == 0 || !alnum(reply[at - 1])) && (at + a.size() == reply.size() || !alnum(reply[at + a.size()]))) return true;
    return false;
  };
  std::size_t found = 0;
  for (const auto& a : t.answers) found += holds(a);
  return t.answers.empty() ? 0.0 : static_cast<double>(found) / static_cast<double>(t.answers.size());
}

}  // namespace kvdrive::longbench
