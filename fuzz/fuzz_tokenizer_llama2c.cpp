// The llama2.c tokenizer.bin reader (examples/llama3/tokenizer/tokenizer_llama2c.hpp) on arbitrary bytes,
// then an encode and a decode with what it read. The first byte picks the vocabulary size.
#include <string>

#include "harness.hpp"
#include "tokenizer/tokenizer_llama2c.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static const std::string path = kvdrive::fuzz::input_path("_tokenizer.bin");
  const int vocab = 259 + data[0] % 128;
  return kvdrive::fuzz::with_file(path, data + 1, size - 1, [&](const std::string& p) {
    kvdrive::llama::Llama2cTokenizer t(p, vocab);
    const auto ids = t.encode("Hello, fuzz! 123 \xc3\xa9", true);
    for (int id : ids) (void)t.decode(1, id);
  });
}
