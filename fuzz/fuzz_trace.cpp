// The Q/K/V trace reader (eval/trace.hpp, eval/recorded.hpp; docs/trace-format.md) on arbitrary
// bytes: open, check every layer's positions, and read the first stream.
#include "harness.hpp"
#include "kvdrive/eval/recorded.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kvdrive::fuzz::input_path(".kvdtrace");
  return kvdrive::fuzz::with_file(path, data, size, [](const std::string& p) {
    const kvdrive::eval::RecordedTrace t(p, 1);
    const auto s = t.stream(0, 0);
    (void)s.tokens();
  });
}
