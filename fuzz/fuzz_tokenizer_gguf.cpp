// The GGUF tokenizer (examples/llama3/tokenizer_gguf.hpp) on arbitrary text, with the tiny
// vocabularies of tests/data/tokenizer: byte-level BPE under each pre-tokenizer family and
// SentencePiece. The first input byte picks the tokenizer and the settings, the rest is the text.
// A kvdrive::Error is an answer only for a 4-byte sequence past U+10FFFF (llama.cpp aborts there);
// every id must be in range; for BPE, the pieces of text that is UTF-8 give the text back.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "gguf_loader.hpp"
#include "tokenizer_gguf.hpp"

namespace {

using kvdrive::llama::GgufTokenizer;
using kvdrive::llama::GgufVocab;

std::vector<std::unique_ptr<GgufTokenizer>> make_tokenizers() {
  const std::filesystem::path dir = std::filesystem::path(__FILE__).parent_path().parent_path() / "tests" / "data" / "tokenizer";
  std::vector<std::unique_ptr<GgufTokenizer>> out;
  const GgufVocab bpe = kvdrive::llama::read_vocab(kvdrive::llama::GgufFile((dir / "tiny-gpt2.gguf").string()));
  for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "qwen2", "default"}) {
    GgufVocab v = bpe;
    v.pre = pre;
    out.push_back(std::make_unique<GgufTokenizer>(std::move(v)));
  }
  for (const char* name : {"tiny-spm.gguf", "tiny-qwen2.gguf"})
    out.push_back(std::make_unique<GgufTokenizer>(kvdrive::llama::read_vocab(kvdrive::llama::GgufFile((dir / name).string()))));
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
