// The Llama-3 tokenizer.model reader (tiktoken BPE ranks, examples/llama3/tokenizer/tokenizer_tiktoken.hpp)
// on arbitrary bytes, then an encode and a decode with what it read.
#include <string>

#include "harness.hpp"
#include "tokenizer/tokenizer_tiktoken.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kvdrive::fuzz::input_path("_tokenizer.model");
  return kvdrive::fuzz::with_file(path, data, size, [](const std::string& p) {
    kvdrive::llama::TiktokenTokenizer t(p);
    const auto ids = t.encode("Hello, fuzz! 123 \xc3\xa9", true);
    for (int id : ids) (void)t.decode(id);
  });
}
