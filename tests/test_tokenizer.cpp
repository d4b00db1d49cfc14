// The two tokenizers of the reference decoder, on vocabulary files the test builds.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;

namespace {

std::filesystem::path temp(const char* name) { return std::filesystem::temp_directory_path() / name; }

/// A llama2.c tokenizer.bin: <unk>, <s>, </s>, the 256 byte tokens, then `pieces` with scores.
int write_llama2c(const std::filesystem::path& path, const std::vector<std::pair<std::string, float>>& pieces) {
  std::vector<std::pair<std::string, float>> all{{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    all.emplace_back(name, 0.0f);
  }
  all.insert(all.end(), pieces.begin(), pieces.end());
  std::ofstream f(path, std::ios::binary);
  const std::int32_t max_len = 16;
  f.write(reinterpret_cast<const char*>(&max_len), 4);
  for (const auto& [s, score] : all) {
    const auto len = static_cast<std::int32_t>(s.size());
    f.write(reinterpret_cast<const char*>(&score), 4);
    f.write(reinterpret_cast<const char*>(&len), 4);
    f.write(s.data(), len);
  }
  return static_cast<int>(all.size());
}

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < in.size(); i += 3) {
    std::uint32_t n = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) n |= static_cast<unsigned char>(in[i + 1]) << 8;
    if (i + 2 < in.size()) n |= static_cast<unsigned char>(in[i + 2]);
    out += t[n >> 18 & 63];
    out += t[n >> 12 & 63];
    out += i + 1 < in.size() ? t[n >> 6 & 63] : '=';
    out += i + 2 < in.size() ? t[n & 63] : '=';
  }
  return out;
}

/// A tiktoken file: the 256 bytes (ranks 0-255), then `merged` pieces in rank order.
void write_tiktoken(const std::filesystem::path& path, const std::vector<std::string>& merged) {
  std::ofstream f(path);
  int rank = 0;
  for (int b = 0; b < 256; ++b) f << base64(std::string(1, static_cast<char>(b))) << ' ' << rank++ << '\n';
  for (const auto& m : merged) f << base64(m) << ' ' << rank++ << '\n';
}

}  // namespace

TEST_CASE("llama2.c tokenizer: merges by score, byte fallback, and round-trips") {
  const auto path = temp("kvd_tok.bin");
  const std::vector<std::pair<std::string, float>> pieces{{" ", -1},    {"a", -2},     {"b", -2},    {"c", -2},       {"h", -2}, {"e", -2},
                                                          {"l", -2},    {"o", -2},     {" h", -10},  {"he", 5},       {"ll", 4}, {"llo", 3},
                                                          {"hello", 2}, {" hello", 1}, {"ab", 0.5f}, {"\xc3\xa9", -3}};
  const int vocab = write_llama2c(path, pieces);
  Tokenizer tok(path.string(), vocab);
  CHECK_FALSE(tok.is_tiktoken());
  const int first = 259;  // the first piece after <unk>, <s>, </s> and the byte tokens
  // " " + h e l l o merges he, ll, llo, hello, then " hello" (best score first).
  CHECK(tok.encode("hello", false) == std::vector<int>{first + 13});
  CHECK(tok.encode("hello", true) == std::vector<int>{1, first + 13});
  // Characters without a piece fall back to their UTF-8 bytes (<0xXX> = 3 + byte).
  CHECK(tok.encode("x", false) == std::vector<int>{first, 3 + 'x'});
  CHECK(tok.encode("\xe6\x97\xa5", false) == std::vector<int>{first, 3 + 0xe6, 3 + 0x97, 3 + 0xa5});
  for (const std::string text : {"hello", "ab cab", "hello abc", "xyz!", "h\xc3\xa9llo", "\xe6\x97\xa5\xe6\x9c\xac hello"}) {
    CAPTURE(text);
    const auto ids = tok.encode(text, true);
    std::string out;
    int prev = -1;
    for (int id : ids) {
      if (id != 1) out += tok.decode(prev, id);
      prev = id;
    }
    CHECK(out == text);  // the dummy-prefix space after BOS is dropped
  }
  CHECK_THROWS_WITH_AS(Tokenizer(path.string(), vocab + 5), doctest::Contains("truncated at token"), Error);
  CHECK_THROWS_WITH_AS(Llama2cTokenizer(path.string(), 5), doctest::Contains("too small"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("Llama-3 tokenizer: pre-tokenizer pattern, byte-level BPE by rank, special tokens") {
  const auto path = temp("kvd_tok.model");
  write_tiktoken(path, {"he", "ll", "llo", "hello", " w", "or", " wor", "ld", " world"});
  Tokenizer tok(path.string(), 1000);
  REQUIRE(tok.is_tiktoken());
  TiktokenTokenizer tt(path.string());
  // The Llama-3 pattern: words with their leading space, contractions, digits in threes,
  // punctuation runs with their newlines, and whitespace before a word left for the word.
  CHECK(tt.split("Hello world's 12345!!\n\n  x") == std::vector<std::string>{"Hello", " world", "'s", " ", "123", "45", "!!\n\n", " ", " x"});
  CHECK(tt.split("don't") == std::vector<std::string>{"don", "'t"});
  // BPE: lowest rank first. hello: he(256) ll(257) llo(258) hello(259); " world" ends at 264.
  CHECK(tok.encode("hello world", false) == std::vector<int>{259, 264});
  CHECK(tok.encode("hello", true) == std::vector<int>{265, 259});
  CHECK(tt.special("<|start_header_id|>") == 265 + 6);
  CHECK(tt.eot() == 265 + 9);
  CHECK(tok.encode("<|begin_of_text|>hello<|eot_id|>", false) == std::vector<int>{265, 259, 274});
  CHECK(tok.stops() == std::vector<int>{266, 274});
  for (const std::string text : {"hello world", "Hello, w\xc3\xb6rld! 42\n", "<|start_header_id|>user<|end_header_id|>\n\nhi"}) {
    CAPTURE(text);
    std::string out;
    for (int id : tok.encode(text, false)) out += tok.decode(-1, id);
    CHECK(out == text);
  }
  { std::ofstream(path) << "aGVsbG8= notanumber\n"; }
  CHECK_THROWS_WITH_AS(TiktokenTokenizer(path.string()), doctest::Contains("invalid rank"), Error);
  {
    std::ofstream(path) << "QQ== 100000000\n";  // one token at a huge rank: gaps are rejected, nothing huge allocated
  }
  CHECK_THROWS_WITH_AS(TiktokenTokenizer(path.string()), doctest::Contains("without gaps"), Error);
  {
    std::ofstream f(path, std::ios::binary);  // CRLF line ends
    for (int b = 0; b < 256; ++b) f << base64(std::string(1, static_cast<char>(b))) << ' ' << b << "\r\n";
  }
  CHECK(Tokenizer(path.string(), 1000).encode("ab", false) == std::vector<int>{'a', 'b'});
  // Long texts stay linear: many special tokens and a long ordinary run.
  std::string long_text;
  for (int i = 0; i < 20000; ++i) long_text += "<|eot_id|>ab ";
  CHECK(Tokenizer(path.string(), 1000).encode(long_text, false).size() == 20000u * 4);
  std::filesystem::remove(path);
}
