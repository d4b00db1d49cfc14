// kvdrive::Error and the checks that throw it. Host-side validation of arguments, files and
// configuration throws Error with a message naming what was wrong, the value, and what was
// expected. (CUDA launchers return cudaError_t instead; see cuda/check.cuh.)
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace kvdrive {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws kvdrive::Error with an fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kvdrive

/// KVD_EXPECT(condition, "format {}", args...): throws kvdrive::Error when condition is false.
#define KVD_EXPECT(condition, ...)                  \
  do {                                              \
    if (!(condition)) ::kvdrive::fail(__VA_ARGS__); \
  } while (0)
