// SsdTier opening a damaged store (tier/ssd.hpp; Decision 9). Once per process a valid store of
// 48 pages is written (the template); each input then damages a copy of it and the copy is
// opened and every page read. The first byte picks the damage:
//   even: the input replaces the metadata log (PATH.log) from byte 4096 on (its header kept);
//   odd:  the input overwrites the data file at the offset its next 4 bytes give.
// Opening may fail with kvdrive::Error and reads may too (a checksum miss, a page recovery
// dropped), but a read that succeeds must return exactly the bytes written for that key: wrong
// data is a finding (the target aborts). The erased page may come back with its bytes: a
// damaged log can lose the erase record.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ssd_store.hpp"

namespace {

namespace fs = std::filesystem;
using namespace kvdrive::fuzz;

std::string template_store() {
  const std::string path = input_path("_template.store");
  write_store(path);
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static const std::string tmpl = template_store();
  static const std::string path = input_path(".store");
  fs::copy_file(tmpl, path, fs::copy_options::overwrite_existing);
  fs::copy_file(tmpl + ".log", path + ".log", fs::copy_options::overwrite_existing);
  if (data[0] % 2 == 0) {
    fs::resize_file(path + ".log", 4096);
    std::FILE* f = std::fopen((path + ".log").c_str(), "r+b");
    std::fseek(f, 4096, SEEK_SET);
    std::fwrite(data + 1, 1, size - 1, f);
    std::fclose(f);
  } else {
    if (size < 5) return 0;
    std::uint32_t at = 0;
    std::memcpy(&at, data + 1, 4);
    const auto len = static_cast<std::uintmax_t>(fs::file_size(path));
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    std::fseek(f, static_cast<long>(at % (len + 1)), SEEK_SET);
    std::fwrite(data + 5, 1, size - 5, f);
    std::fclose(f);
  }
  try {
    SsdTier t(store_params(path));
    t.open({kStorePage});
    std::vector<std::byte> got(kStorePage);
    for (std::size_t i = 0; i < kStorePages + 2; ++i) {
      const kvdrive::tier::PageKey k = key_of(i);
      if (!t.contains(k)) continue;
      try {
        const kvdrive::tier::ReadRequest r{k, got.data()};
        t.wait(t.submit(std::span<const kvdrive::tier::ReadRequest>(&r, 1)));
      } catch (const kvdrive::Error&) {
        continue;  // a damaged page is refused, as it must be
      }
      // Wrong data, or a page never written, is a finding. The erased page may come back intact:
      // recovery stops at the first bad record, so a damaged log can lose the erase (Decision 9).
      if (i >= kStorePages || got != page_bytes(k)) std::abort();
    }
  } catch (const kvdrive::Error&) {
  }
  return 0;
}
