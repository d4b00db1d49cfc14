// The safetensors reader (examples/llama3/model/safetensors.hpp) on arbitrary bytes: the header's
// length, its JSON and every tensor's dtype, shape and offsets.
#include "harness.hpp"
#include "model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kvdrive::fuzz::input_path(".safetensors");
  return kvdrive::fuzz::with_file(path, data, size, [](const std::string& p) { kvdrive::llama::SafetensorsFile f(p); });
}
