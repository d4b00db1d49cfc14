// The GGUF tokenizer (examples/llama3/tokenizer/tokenizer_gguf.hpp) on arbitrary text, with the tiny
// vocabularies of tests/data/tokenizer: byte-level BPE under each pre-tokenizer family and
// SentencePiece. The first input byte picks the tokenizer and the settings, the rest is the text.
// The vocabularies are committed as the text form of their GGUF files (tiny-*.gguf.json); at
// start-up each is written back (tests/gguf_writer.hpp) to a temporary file and read with
// read_vocab, as the tests do.
// A kvdrive::Error is an answer only for a 4-byte sequence past U+10FFFF (llama.cpp aborts there);
// every id must be in range; for BPE, the pieces of text that is UTF-8 give the text back.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "../tests/gguf_writer.hpp"
#include "model/gguf.hpp"
#include "model/gguf_loader.hpp"
#include "tokenizer/tokenizer_gguf.hpp"

namespace {

using kvdrive::llama::GgufTokenizer;
using kvdrive::llama::GgufVocab;

/// The vocabulary of tests/data/tokenizer/<name>.gguf.json: its GGUF file, written to a
/// temporary file (removed again), read with read_vocab.
GgufVocab tiny_vocab(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(__FILE__).parent_path().parent_path() / "tests" / "data" / "tokenizer";
  const std::filesystem::path gguf =
      std::filesystem::temp_directory_path() / ("kvd_fuzz_tokenizer_gguf_" + std::to_string(::getpid()) + "_" + name + ".gguf");
  kvdrive::test::write_bytes(gguf, kvdrive::test::gguf_from_text(kvdrive::test::read_gguf_text(dir / (name + ".gguf.json"))));
  GgufVocab v = kvdrive::llama::read_vocab(kvdrive::llama::GgufFile(gguf.string()));
  std::error_code ec;
  std::filesystem::remove(gguf, ec);
  return v;
}

std::vector<std::unique_ptr<GgufTokenizer>> make_tokenizers() {
  std::vector<std::unique_ptr<GgufTokenizer>> out;
  const GgufVocab bpe = tiny_vocab("tiny-gpt2");
  for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "qwen2", "default"}) {
    GgufVocab v = bpe;
    v.pre = pre;
    out.push_back(std::make_unique<GgufTokenizer>(std::move(v)));
  }
  for (const char* name : {"tiny-spm", "tiny-qwen2"}) out.push_back(std::make_unique<GgufTokenizer>(tiny_vocab(name)));
  return out;
}

/// Whether llama.cpp reads `s` as it is: every byte in a well-formed sequence (what it reads as
/// U+FFFD is not), and no code point past U+10FFFF.
bool reads_as_is(const std::string& s, bool& past_max) {
  using namespace kvdrive::llama::gguf_tokenizer_detail;
  std::string again;
  past_max = false;
  for (const std::uint32_t c : decode_utf8(s)) {
    if (c > 0x10FFFF) {
      past_max = true;
      return false;
    }
    append_utf8(c, again);
  }
  return again == s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<std::unique_ptr<GgufTokenizer>> tokenizers = make_tokenizers();
  if (size == 0) return 0;
  const GgufTokenizer& tok = *tokenizers[data[0] % tokenizers.size()];
  const bool add_special = (data[0] >> 4) & 1, parse_special = (data[0] >> 5) & 1;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  bool past_max = false;
  const bool as_is = reads_as_is(text, past_max);
  std::vector<int> ids;
  try {
    ids = tok.tokenize(text, add_special, parse_special);
  } catch (const kvdrive::Error&) {
    if (!past_max || tok.type() != GgufTokenizer::Type::bpe) std::abort();
    return 0;
  }
  for (const int id : ids)
    if (id < 0 || id >= tok.n_tokens()) std::abort();
  (void)tok.detokenize(ids, true, true);
  if (tok.type() == GgufTokenizer::Type::bpe && as_is && !add_special && !parse_special) {
    std::string back;
    for (const int id : ids) back += tok.token_to_piece(id, true);
    if (back != text) std::abort();
  }
  return 0;
}
