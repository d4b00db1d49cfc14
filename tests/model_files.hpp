// Where the tests find the real model (SmolLM2-135M-Instruct, which scripts/get-model fetches
// into ${KVD_MODEL_DIR:-$HOME/.cache/kvdrive/models}) and the committed golden files
// (tests/data). A test that needs the model skips with a message when it is absent, except under
// KVD_REQUIRE_MODEL=1 (CI), where a missing model fails it.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace kvdrive::test {

inline constexpr const char* kSmolLM2File = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr std::uintmax_t kSmolLM2Bytes = 98362432;  // scripts/get-model checks its sha256

inline std::filesystem::path model_dir() {
  if (const char* d = std::getenv("KVD_MODEL_DIR"); d != nullptr && *d != '\0') return d;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr && *home != '\0' ? home : "/tmp") / ".cache" / "kvdrive" / "models";
}

inline bool model_required() {
  const char* r = std::getenv("KVD_REQUIRE_MODEL");
  return r != nullptr && std::string(r) == "1";
}

/// The SmolLM2 GGUF, or nullopt after a skip message (a failure under KVD_REQUIRE_MODEL=1).
inline std::optional<std::filesystem::path> smollm2_or_skip() {
  const std::filesystem::path p = model_dir() / kSmolLM2File;
  std::error_code ec;
  if (std::filesystem::is_regular_file(p) && std::filesystem::file_size(p, ec) == kSmolLM2Bytes) return p;
  if (model_required()) FAIL("KVD_REQUIRE_MODEL=1 but the model is missing or not the checked file: " << p.string() << " (run scripts/get-model)");
  else MESSAGE("SKIPPED: " << p.string() << " is absent or not the checked file (run scripts/get-model to fetch SmolLM2-135M-Instruct)");
  return std::nullopt;
}

/// A committed golden file under tests/data.
inline std::filesystem::path test_data(const std::string& rel) { return std::filesystem::path(KVD_TEST_DATA_DIR) / rel; }

}  // namespace kvdrive::test
