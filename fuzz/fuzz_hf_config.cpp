// Hugging Face config.json parsing (examples/llama3/model/hf_loader.hpp) on arbitrary bytes.
#include "harness.hpp"
#include "model/hf_loader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kvdrive::fuzz::input_path("_config.json");
  return kvdrive::fuzz::with_file(path, data, size, [](const std::string& p) { (void)kvdrive::llama::parse_hf_config(p); });
}
