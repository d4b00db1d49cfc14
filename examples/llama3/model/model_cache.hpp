// Where kvd-llama and the benchmarks find the project's real model: the SmolLM2-135M-Instruct
// GGUF that scripts/get-model caches in $KVD_MODEL_DIR (default ~/.cache/kvdrive/models), and
// how a model file is told to be GGUF.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

inline constexpr const char* kSmolLM2File = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The folder the project's models are cached in.
inline std::filesystem::path model_cache_dir() {
  const char* dir = std::getenv("KVD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  return dir != nullptr && *dir != '\0' ? std::filesystem::path(dir)
                                        : std::filesystem::path(home != nullptr && *home != '\0' ? home : "/tmp") / ".cache/kvdrive/models";
}

/// The cached file of the project's real model (scripts/get-model fetches it).
inline std::string smollm2_path() {
  const std::filesystem::path f = model_cache_dir() / kSmolLM2File;
  KVD_EXPECT(std::filesystem::is_regular_file(f), "--model smollm2: {} is missing; run scripts/get-model to fetch it", f.string());
  return f.string();
}

/// A GGUF file: by its first four bytes, whatever its name.
inline bool is_gguf(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace kvdrive::llama
