// The GGUF tokenizer against llama.cpp: the golden files scripts/make-tokenizer-golden.py wrote
// with llama.cpp's tokenizer (llama-cpp-python) for SmolLM2-135M-Instruct and for tiny GGUF
// vocabularies of the other kinds (gpt-2, llama-bpe, qwen2 and default pre-tokenizers;
// SentencePiece with and without the space prefix): ids with add_special and parse_special on
// and off, detokenized text, pieces, special ids and the end-of-generation set. A file of random
// texts from the same script (--random) is checked too when KVD_TOKENIZER_EXTRA_GOLDEN names it.
// The tiny vocabularies are committed as the text form of the GGUF files llama.cpp read
// (tests/data/tokenizer/tiny-*.gguf.json); the tests write those files back, byte for byte
// (tests/gguf_fixtures.hpp checks their sha256), and read them with read_vocab.
#include <doctest/doctest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/gguf.hpp"
#include "gguf_fixtures.hpp"
#include "model/gguf_loader.hpp"
#include "model_files.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;
using nlohmann::json;

namespace {

const char* const kTinyModels[] = {"tiny-gpt2", "tiny-llama-bpe", "tiny-qwen2", "tiny-default", "tiny-spm", "tiny-spm-noprefix"};

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), "cannot open " << p.string() << " (scripts/make-tokenizer-golden.py writes it)");
  return json::parse(f);
}

/// A byte string of a golden file: the string itself, or {"hex": ...}.
std::string bytes_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  const std::string hex = v.at("hex").get<std::string>();
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::vector<int> id_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(std::stoi(x));
  return out;
}

/// The ids of one setting: a list, or "=KEY", "=KEY<a,b", "=KEY>c", "=KEY<a>c" (KEY's ids with
/// those before and after).
std::vector<int> ids_of(const json& ids, const std::string& key) {
  const json& v = ids.at(key);
  if (v.is_array()) return v.get<std::vector<int>>();
  const std::string ref = v.get<std::string>();
  REQUIRE(ref.size() >= 3);
  REQUIRE(ref[0] == '=');
  const std::size_t lt = ref.find('<'), gt = ref.find('>');
  std::vector<int> out =
      lt != std::string::npos ? id_list(ref.substr(lt + 1, (gt == std::string::npos ? ref.size() : gt) - lt - 1)) : std::vector<int>{};
  const std::vector<int> mid = ids_of(ids, ref.substr(1, 2));
  out.insert(out.end(), mid.begin(), mid.end());
  if (gt != std::string::npos) {
    const std::vector<int> suf = id_list(ref.substr(gt + 1));
    out.insert(out.end(), suf.begin(), suf.end());
  }
  return out;
}

std::string shown(const std::string& s, std::size_t max = 80) {
  std::string out;
  for (const char c : s.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u == '\\') out += "\\\\";
    else if (u >= 0x20 && u < 0x7F) out += c;
    else out += fmt::format("\\x{:02x}", u);
  }
  return s.size() > max ? out + "..." : out;
}

/// The GGUF file of a golden source: "smollm2" (the cached model, nullopt if absent) or a file
/// under tests/data ("tokenizer/tiny-gpt2.gguf"), written from its text form (<source>.json).
std::optional<std::filesystem::path> gguf_of(const std::string& source) {
  if (source == "smollm2") return test::smollm2_or_skip();
  return test::gguf_fixture(source);
}

GgufTokenizer tokenizer_of(const std::filesystem::path& gguf) { return GgufTokenizer(read_vocab(GgufFile(gguf.string()))); }

/// Counts mismatches, reporting the first few.
struct Mismatches {
  std::string model;
  int count = 0;
  void operator()(const std::string& what) {
    if (++count <= 12) MESSAGE(model << ": " << what);
  }
};

void check_vocab(const json& v, const GgufTokenizer& tok, Mismatches& bad) {
  CHECK(tok.n_tokens() == v.at("n_tokens").get<int>());
  CHECK(tok.bos() == v.at("bos").get<int>());
  CHECK(tok.eos() == v.at("eos").get<int>());
  CHECK(tok.eot() == v.at("eot").get<int>());
  CHECK(tok.add_bos() == v.at("add_bos").get<bool>());
  CHECK(tok.add_eos() == v.at("add_eos").get<bool>());
  CHECK(tok.eog() == v.at("eog").get<std::vector<int>>());
  if (v.contains("attrs")) {
    const auto attrs = v.at("attrs").get<std::vector<std::uint32_t>>();
    for (int id = 0; id < tok.n_tokens() && id < static_cast<int>(attrs.size()); ++id)
      if (tok.attr(id) != attrs[static_cast<std::size_t>(id)])
        bad(fmt::format("token {} '{}': attributes {:#x}, llama.cpp {:#x}", id, shown(tok.text(id)), tok.attr(id),
                        attrs[static_cast<std::size_t>(id)]));
  }
}

/// Every case of a golden file: ids for the four settings, and the detokenized text.
void check_cases(const json& cases, const GgufTokenizer& tok, Mismatches& bad) {
  int index = 0;
  for (const json& c : cases) {
    const std::string text = bytes_of(c.at("text"));
    for (const bool add : {true, false}) {
      for (const bool parse : {true, false}) {
        const std::string key = fmt::format("{}{}", int(add), int(parse));
        const std::vector<int> want = ids_of(c.at("ids"), key);
        std::vector<int> got;
        try {
          got = tok.tokenize(text, add, parse);
        } catch (const Error& e) {
          bad(fmt::format("case {} '{}' add_special={} parse_special={}: threw {}", index, shown(text), add, parse, e.what()));
          continue;
        }
        if (got != want)
          bad(fmt::format("case {} '{}' add_special={} parse_special={}:\n  got       {}\n  llama.cpp {}", index, shown(text), add, parse,
                          fmt::join(got, ","), fmt::join(want, ",")));
      }
    }
    if (c.contains("detok")) {
      const std::vector<int> ids = ids_of(c.at("ids"), "11");
      for (const bool remove : {false, true}) {
        for (const bool unparse : {false, true}) {
          const std::string key = fmt::format("{}{}", int(remove), int(unparse));
          const std::string want = c.at("detok").contains(key) ? bytes_of(c.at("detok").at(key)) : text;
          const std::string got = tok.detokenize(ids, remove, unparse);
          if (got != want)
            bad(fmt::format("case {} '{}' detokenize remove_special={} unparse_special={}:\n  got       '{}'\n  llama.cpp '{}'", index, shown(text),
                            remove, unparse, shown(got, 200), shown(want, 200)));
        }
      }
    }
    ++index;
  }
}

void check_pieces(const json& p, const GgufTokenizer& tok, Mismatches& bad) {
  const auto ids = p.at("ids").get<std::vector<int>>();
  const json& plain = p.at("plain");
  const json& special = p.at("special");
  REQUIRE(plain.size() == ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    const std::string want = bytes_of(plain[i]);
    const std::string key = std::to_string(id);
    const std::string want_special = special.contains(key) ? bytes_of(special.at(key)) : want;
    if (tok.token_to_piece(id, false) != want)
      bad(fmt::format("piece of {} '{}': '{}', llama.cpp '{}'", id, shown(tok.text(id)), shown(tok.token_to_piece(id, false)), shown(want)));
    if (tok.token_to_piece(id, true) != want_special)
      bad(fmt::format("special piece of {} '{}': '{}', llama.cpp '{}'", id, shown(tok.text(id)), shown(tok.token_to_piece(id, true)),
                      shown(want_special)));
  }
}

void check_golden(const std::string& name) {
  const json g = read_json(test::test_data("tokenizer/" + name + ".golden.json"));
  const std::optional<std::filesystem::path> gguf = gguf_of(g.at("source").get<std::string>());
  if (!gguf) return;
  const GgufTokenizer tok = tokenizer_of(*gguf);
  Mismatches bad{name};
  check_vocab(g.at("vocab"), tok, bad);
  check_cases(g.at("cases"), tok, bad);
  check_pieces(g.at("pieces"), tok, bad);
  CHECK_MESSAGE(bad.count == 0, name << ": " << bad.count << " mismatches with llama.cpp");
}

GgufVocab tiny_vocab(const char* name) { return read_vocab(GgufFile(test::gguf_fixture(fmt::format("tokenizer/{}.gguf", name)).string())); }

}  // namespace

TEST_CASE("GGUF tokenizer: the tiny vocabularies give llama.cpp's ids, pieces and text") {
  for (const char* name : kTinyModels) {
    CAPTURE(name);
    check_golden(name);
  }
}

TEST_CASE("GGUF tokenizer: SmolLM2 gives llama.cpp's ids, pieces and text") { check_golden("smollm2"); }

TEST_CASE("GGUF tokenizer: random texts from KVD_TOKENIZER_EXTRA_GOLDEN") {
  const char* path = std::getenv("KVD_TOKENIZER_EXTRA_GOLDEN");
  if (path == nullptr || *path == '\0') return;
  const json all = read_json(path);
  for (const json& g : all) {
    const std::string source = g.at("source").get<std::string>();
    CAPTURE(source);
    const std::optional<std::filesystem::path> gguf = gguf_of(source);
    if (!gguf) continue;
    const GgufTokenizer tok = tokenizer_of(*gguf);
    Mismatches bad{source};
    check_vocab(g.at("vocab"), tok, bad);
    check_cases(g.at("cases"), tok, bad);
    CHECK_MESSAGE(bad.count == 0, source << ": " << bad.count << " mismatches with llama.cpp on " << g.at("cases").size() << " random texts");
  }
}

TEST_CASE("GGUF tokenizer: SmolLM2's special tokens, BOS and end of generation") {
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  const Tokenizer t(read_vocab(GgufFile(path->string())));
  REQUIRE(t.is_gguf());
  const GgufTokenizer& g = *t.gguf();
  CHECK(g.type() == GgufTokenizer::Type::bpe);
  CHECK(g.pre() == "smollm");
  CHECK(t.token_id("<|im_start|>") == 1);
  CHECK(t.token_id("<|im_end|>") == 2);
  CHECK(t.token_id("<|no such token|>") == std::nullopt);
  CHECK(t.bos() == 1);
  CHECK_FALSE(t.adds_bos());  // tokenizer.ggml.add_bos_token is false
  CHECK_FALSE(t.adds_bos("Hello"));
  const std::vector<int> stops = t.stops();
  CHECK(std::find(stops.begin(), stops.end(), 2) != stops.end());  // <|im_end|>
  CHECK(std::find(stops.begin(), stops.end(), 0) != stops.end());  // <|endoftext|>
  CHECK(g.is_eog(2));
  CHECK_FALSE(g.is_eog(1));
  // Special-token strings are tokens only when parsed.
  const std::string chat = "<|im_start|>user\nHi<|im_end|>\n";
  const std::vector<int> parsed = t.encode(chat, false, true);
  REQUIRE(parsed.size() >= 3);
  CHECK(parsed.front() == 1);
  CHECK(std::find(parsed.begin(), parsed.end(), 2) != parsed.end());
  const std::vector<int> plain = t.encode(chat, false);
  CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
  CHECK(t.encode(chat, true, true).front() == 1);
  CHECK(t.encode("Hi", true, false) == std::vector<int>{1, g.tokenize("Hi", false, false)[0]});
  // Streaming: pieces after one another give the text; control tokens show nothing.
  std::string streamed;
  int prev = -1;
  for (const int id : parsed) {
    streamed += t.decode(prev, id);
    prev = id;
  }
  CHECK(streamed == "user\nHi\n");
  CHECK(g.token_to_piece(2, true) == "<|im_end|>");
  CHECK(g.detokenize(parsed, false, true) == chat);
}

TEST_CASE("GGUF tokenizer: a 16 KB document in well under a second") {
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  const GgufTokenizer tok = tokenizer_of(*path);
  std::string doc;
  for (const char* name : {"GPL-3", "Apache-2.0", "MPL-2.0"}) {
    std::ifstream f(std::string("/usr/share/common-licenses/") + name);
    std::stringstream ss;
    ss << f.rdbuf();
    doc += ss.str();
  }
  if (doc.size() < 16384) doc = std::string(16384 / 8, 'x') + " 1234 " + doc;  // without the licence texts: still 16 KB
  doc.resize(16384);
  while ((static_cast<unsigned char>(doc.back()) & 0xC0) == 0x80) doc.pop_back();  // whole characters
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> ids = tok.tokenize(doc, true, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(fmt::format("{} bytes -> {} tokens in {:.1f} ms", doc.size(), ids.size(), s * 1e3));
  CHECK(ids.size() > 1000);
  CHECK(s < 0.5);
  CHECK(tok.detokenize(ids) == doc);
}

TEST_CASE("GGUF tokenizer: pre-tokenizer words") {
  GgufVocab v = tiny_vocab("tiny-gpt2");
  auto words = [&](const char* pre, std::string_view text) {
    GgufVocab w = v;
    w.pre = pre;
    return GgufTokenizer(std::move(w)).pretokenize(text);
  };
  using W = std::vector<std::string>;
  // gpt-2: a space joins what follows; a run of spaces leaves its last one to the next word.
  CHECK(words("gpt-2", "Hello  world's 1234!!") == W{"Hello", " ", " world", "'s", " 1234", "!!"});
  // smollm: digits one by one, then gpt-2.
  CHECK(words("smollm", "a 1234 b") == W{"a", " ", "1", "2", "3", "4", " b"});
  // llama3: numbers in threes, newlines grouped, a non-letter may lead letters, contractions fold case.
  CHECK(words("llama-bpe", "x 1234567\n\n  y IT'S") == W{"x", " ", "123", "456", "7", "\n\n", " ", " y", " IT", "'S"});
  // qwen2: digits one by one.
  CHECK(words("qwen2", "ab12 c") == W{"ab", "1", "2", " c"});
  // default: punctuation runs apart, numbers in threes.
  CHECK(words("default", "a,b 12345") == W{"a", ",", "b", " ", "123", "45"});
  // Unicode classes: letters, numbers, White_Space (U+3000 is one, U+180E is not).
  CHECK(words("gpt-2", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87") == W{"caf\xc3\xa9", " \xe4\xb8\xad\xe6\x96\x87"});
  CHECK(words("gpt-2", "a\xe3\x80\x80\xe3\x80\x80z") == W{"a", "\xe3\x80\x80", "\xe3\x80\x80", "z"});  // " ?" is U+0020 only
  CHECK(words("gpt-2", "a\xe1\xa0\x8ez") == W{"a", "\xe1\xa0\x8e", "z"});
  // Bytes that are no UTF-8 are read as U+FFFD.
  CHECK(words("gpt-2", "a\xff") == W{"a", "\xef\xbf\xbd"});
}

namespace {

/// llama.cpp's regex list run by PCRE2 as llama.cpp runs it: each regex over each piece of the one
/// before, matches and the text between them pieces. \s is spelt out as White_Space (PCRE2's \s
/// also takes U+180E). PCRE2 10.42 knows Unicode 14, llama.cpp's tables 15.1: the texts keep to
/// code points the two agree on.
std::vector<std::string> pcre2_split(const std::vector<std::string_view>& regexes, const std::string& text) {
  const std::string ws = "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  std::vector<std::string> pieces{text};
  for (const std::string_view re : regexes) {
    std::string pattern;
    bool in_class = false;
    for (std::size_t i = 0; i < re.size(); ++i) {
      if (re[i] == '\\' && i + 1 < re.size() && (re[i + 1] == 's' || re[i + 1] == 'S')) {
        pattern += in_class ? ws : (re[i + 1] == 's' ? "[" : "[^") + ws + "]";
        ++i;
        continue;
      }
      if (re[i] == '\\' && i + 1 < re.size()) {
        pattern += re.substr(i, 2);
        ++i;
        continue;
      }
      if (re[i] == '[') in_class = true;
      if (re[i] == ']') in_class = false;
      pattern += re[i];
    }
    int err = 0;
    PCRE2_SIZE at = 0;
    std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr), &pcre2_code_free);
    REQUIRE_MESSAGE(code != nullptr, "PCRE2 cannot compile " << pattern << " (error " << err << " at " << at << ")");
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(pcre2_match_data_create_from_pattern(code.get(), nullptr),
                                                                           &pcre2_match_data_free);
    std::vector<std::string> next;
    for (const std::string& p : pieces) {
      PCRE2_SIZE from = 0;
      while (from < p.size()) {
        const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), from, 0, md.get(), nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        REQUIRE(ov[1] > ov[0]);
        if (ov[0] > from) next.push_back(p.substr(from, ov[0] - from));
        next.push_back(p.substr(ov[0], ov[1] - ov[0]));
        from = ov[1];
      }
      if (from < p.size()) next.push_back(p.substr(from));
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace

TEST_CASE("GGUF tokenizer: the pre-tokenizer scanners split as llama.cpp's regexes do (PCRE2)") {
  const GgufVocab v = tiny_vocab("tiny-gpt2");
  // Characters of every class the patterns tell apart, on which Unicode 14 and 15.1 agree.
  const std::vector<std::string> alphabet = {"a",
                                             "b",
                                             "Z",
                                             "s",
                                             "t",
                                             "S",
                                             "T",
                                             "m",
                                             "d",
                                             "r",
                                             "e",
                                             "v",
                                             "l",
                                             "L",
                                             "E",
                                             "'",
                                             "'",
                                             "0",
                                             "1",
                                             "7",
                                             " ",
                                             " ",
                                             " ",
                                             " ",
                                             "\t",
                                             "\n",
                                             "\n",
                                             "\r",
                                             "\x0b",
                                             "\x0c",
                                             ".",
                                             ",",
                                             "!",
                                             "?",
                                             "$",
                                             "+",
                                             "<",
                                             "=",
                                             ">",
                                             "^",
                                             "~",
                                             "|",
                                             "`",
                                             "(",
                                             "]",
                                             "_",
                                             "-",
                                             "#",
                                             "%",
                                             "&",
                                             "*",
                                             "/",
                                             "\\",
                                             "{",
                                             "\xc3\xa9",
                                             "\xc3\x9f",
                                             "\xce\xbb",
                                             "\xd0\x96",
                                             "\xe4\xb8\xad",
                                             "\xe3\x81\xae",
                                             "\xea\xb0\x80",
                                             "\xd9\xa3",
                                             "\xef\xbc\x91",
                                             "\xc2\xb2",
                                             "\xc2\xbd",
                                             "\xe2\x85\xab",
                                             "\xcc\x81",
                                             "\xe0\xa4\x95",
                                             "\xe0\xa5\x8d",
                                             "\xf0\x9f\x98\x80",
                                             "\xf0\x9f\x8f\xbd",
                                             "\xe2\x80\x8d",
                                             "\xc2\xa0",
                                             "\xe3\x80\x80",
                                             "\xe2\x80\xa8",
                                             "\xc2\x85",
                                             "\xe1\xa0\x8e",
                                             "\xe1\x9a\x80",
                                             "\xe2\x80\x89",
                                             "\x1c",
                                             "\x1f",
                                             "\x7f",
                                             "\xcd\xb8",
                                             "\xee\x80\x80",
                                             "\xc2\xad",
                                             "\xe2\x80\x94",
                                             "\xe2\x80\x99",
                                             "\xc2\xab",
                                             "\xe2\x80\xa6",
                                             "\xc2\xa7",
                                             "\xe3\x80\x82"};
  std::mt19937 rng(1234);
  for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "qwen2", "default"}) {
    CAPTURE(pre);
    GgufVocab w = v;
    w.pre = pre;
    const GgufTokenizer tok(std::move(w));
    int bad = 0;
    for (int n = 0; n < 3000; ++n) {
      std::string text;
      const int len = static_cast<int>(rng() % 24) + 1;
      for (int k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
      const std::vector<std::string> got = tok.pretokenize(text), want = pcre2_split(tok.regexes(), text);
      if (got != want && ++bad <= 5)
        MESSAGE(pre << " '" << shown(text) << "':\n  scanners " << fmt::format("{}", got) << "\n  PCRE2    " << fmt::format("{}", want));
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("GGUF tokenizer: what it refuses") {
  GgufVocab v = tiny_vocab("tiny-gpt2");
  auto message = [](GgufVocab w) -> std::string {
    try {
      GgufTokenizer t(std::move(w));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  {
    GgufVocab w = v;
    w.pre = "gpt2";  // llama.cpp knows it as "gpt-2"
    const std::string m = message(w);
    CHECK(m.find("unknown pre-tokenizer type 'gpt2'") != std::string::npos);
    CHECK(m.find("'gpt-2'") != std::string::npos);
    CHECK(m.find("'smollm'") != std::string::npos);
  }
  for (const char* model : {"bert", "t5", "rwkv", ""}) {
    GgufVocab w = v;
    w.model = model;
    CHECK(message(w).find(fmt::format("tokenizer model '{}'", model)) != std::string::npos);
  }
  {
    GgufVocab w = v;
    w.merges.clear();
    CHECK(message(w).find("merges") != std::string::npos);
  }
  {
    GgufVocab w = v;
    w.tokens[5] = w.tokens[4];
    CHECK(message(w).find("repeats token 4") != std::string::npos);
  }
  {
    GgufVocab w = v;
    w.token_types.resize(3);
    CHECK(message(w).find("token_type") != std::string::npos);
  }
  // A 4-byte sequence past U+10FFFF has no UTF-8 form for the BPE words (llama.cpp aborts on it).
  const GgufTokenizer t(v);
  CHECK_THROWS_AS(t.tokenize("a\xf4\x90\x80\x80", false, false), Error);
  CHECK_THROWS_AS(t.token_to_piece(t.n_tokens()), Error);
  CHECK_THROWS_AS(t.token_to_piece(-1), Error);
  // SentencePiece without a byte token for a byte it needs.
  GgufVocab s = tiny_vocab("tiny-spm");
  const auto it = std::find(s.tokens.begin(), s.tokens.end(), "<0xFF>");
  REQUIRE(it != s.tokens.end());
  *it = "<0xFF-gone>";
  const GgufTokenizer spm(s);
  CHECK_THROWS_AS(spm.tokenize("\xff", false, false), Error);
}

TEST_CASE("GGUF tokenizer: llama.cpp's defaults where the metadata is silent") {
  GgufVocab v = tiny_vocab("tiny-qwen2");
  const GgufTokenizer q(v);
  CHECK(q.bos() == 11);  // no bos_token_id: llama.cpp's BPE default
  CHECK_FALSE(q.add_bos());
  CHECK(q.eot() == *q.token_id("<|im_end|>"));  // found by its text
  CHECK(q.is_eog(*q.token_id("<|fim_pad|>")));  // FIM pad ends generation
  CHECK(q.is_control(*q.token_id("<|fim_prefix|>")));
  GgufVocab l = tiny_vocab("tiny-llama-bpe");
  l.add_bos.reset();
  CHECK(GgufTokenizer(l).add_bos());  // llama-bpe: BOS by default
  CHECK(GgufTokenizer(l).ignore_merges());
  GgufVocab s = tiny_vocab("tiny-spm");
  CHECK(GgufTokenizer(s).add_space_prefix());
  CHECK(GgufTokenizer(s).add_bos());
  s.add_space_prefix = false;
  CHECK_FALSE(GgufTokenizer(s).add_space_prefix());
}
