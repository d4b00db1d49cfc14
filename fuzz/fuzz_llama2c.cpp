// The llama2.c checkpoint loader (examples/llama3/model/llama2c.hpp) on arbitrary bytes.
#include "harness.hpp"
#include "model/llama2c.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kvdrive::fuzz::input_path(".bin");
  return kvdrive::fuzz::with_file(path, data, size, [](const std::string& p) {
    const kvdrive::llama::Model m = kvdrive::llama::load_llama2c(p);
    (void)m.parameters();
  });
}
