// The GGUF fixtures of tests/data for the tests: each is committed as its text form
// (tests/data/<dir>/<name>.gguf.json, see tests/gguf_writer.hpp and scripts/gguf_json.py) and
// written here, on first use, into a temporary directory of this process (removed at exit). The
// bytes written must have the sha256 the text form names, that of the file gguf-py's GGUFWriter
// wrote when the scripts made the fixture: the tests read the very file the expectations (and
// llama.cpp's golden outputs) were made from.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <system_error>

#include "gguf_writer.hpp"
#include "model_files.hpp"
#include "sha256.hpp"

namespace kvdrive::test {

namespace gguf_fixtures_detail {

/// A directory in TMPDIR for this process's fixtures, removed with everything in it at exit.
struct ScratchDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / fmt::format("kvd_gguf_fixtures_{}", ::getpid());
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

}  // namespace gguf_fixtures_detail

/// The GGUF file `rel` (e.g. "gguf/values.gguf"), written from tests/data/<rel>.json.
inline std::filesystem::path gguf_fixture(const std::string& rel) {
  static gguf_fixtures_detail::ScratchDir dir;
  static std::map<std::string, std::filesystem::path> written;
  if (const auto it = written.find(rel); it != written.end()) return it->second;
  const std::filesystem::path text = test_data(rel + ".json");
  REQUIRE_MESSAGE(std::filesystem::is_regular_file(text), "missing " << text.string() << " (the scripts under scripts/ write it)");
  const nlohmann::json spec = read_gguf_text(text);
  const std::string bytes = gguf_from_text(spec);
  REQUIRE_MESSAGE(sha256(bytes) == spec.at("sha256").get<std::string>(),
                  text.string() << ": the written GGUF is not the file the text form was made from (sha256 " << sha256(bytes) << ")");
  const std::filesystem::path out = dir.path / rel;
  std::filesystem::create_directories(out.parent_path());
  write_bytes(out, bytes);
  return written.emplace(rel, out).first->second;
}

}  // namespace kvdrive::test
