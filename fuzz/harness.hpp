// What every fuzz target shares. The loaders under test take file paths, so the input goes to a
// file first (one per process, rewritten for each input). A kvdrive::Error is the expected
// answer to bad input; anything else that escapes (another exception, a crash, a leak, a hang,
// an allocation past libFuzzer's limit) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "kvdrive/core/error.hpp"

namespace kvdrive::fuzz {

/// The path this process writes its inputs to (in TMPDIR, else /tmp), with `suffix`.
inline std::string input_path(const char* suffix) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/kvd_fuzz_" + std::to_string(::getpid()) + suffix;
}

/// Writes data to `path` and runs f(path); swallows kvdrive::Error only.
template <class F>
int with_file(const std::string& path, const std::uint8_t* data, std::size_t size, F&& f) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    f(path);
  } catch (const kvdrive::Error&) {
  }
  return 0;
}

}  // namespace kvdrive::fuzz
