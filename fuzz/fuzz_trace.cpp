// The Q/K/V trace reader (eval/trace.hpp, eval/recorded.hpp; docs/trace-format.md) on arbitrary
// bytes: open, check every layer's positions, and read the first stream. An input that ends in a
// footer ("KVDTEND!") has its checksum recomputed over the bytes between header and footer
// first, so that the fuzzer gets past the checksum to the record rules; inputs without one test
// the rejection of a file that was not closed.
#include <cstring>
#include <vector>

#include "harness.hpp"
#include "kvdrive/core/xxhash.hpp"
#include "kvdrive/eval/recorded.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using kvdrive::eval::TraceFooter;
  using kvdrive::eval::TraceHeader;
  static const std::string path = kvdrive::fuzz::input_path(".kvdtrace");
  std::vector<std::uint8_t> bytes(data, data + size);
  if (bytes.size() >= sizeof(TraceHeader) + sizeof(TraceFooter) &&
      std::memcmp(bytes.data() + bytes.size() - sizeof(TraceFooter), kvdrive::eval::kTraceEnd, 8) == 0) {
    TraceFooter t;
    std::memcpy(&t, bytes.data() + bytes.size() - sizeof t, sizeof t);
    t.checksum = XXH3_64bits(bytes.data() + sizeof(TraceHeader), bytes.size() - sizeof(TraceHeader) - sizeof t);
    std::memcpy(bytes.data() + bytes.size() - sizeof t, &t, sizeof t);
  }
  return kvdrive::fuzz::with_file(path, bytes.data(), bytes.size(), [](const std::string& p) {
    const kvdrive::eval::RecordedTrace t(p, 1);
    const auto s = t.stream(0, 0);
    (void)s.tokens();
  });
}
