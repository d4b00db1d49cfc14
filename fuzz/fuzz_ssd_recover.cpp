// SsdTier opening a damaged store (tier/ssd.hpp; Decision 9). Once per process a valid store of
// 48 pages is written (the template), in memory (fuzz::MemFile under the store's File seam: no
// disk, no syncs); each input then damages a copy of it and the copy is opened and every page
// read. The first byte picks the damage:
//   0 mod 4: the input replaces the metadata log (PATH.log) from byte 4096 on (its header kept);
//   2 mod 4: the same, but with every record's checksum recomputed first ("sealed"), so that
//            the fuzzer gets past the record check to the sequence, slot and kind rules;
//   odd:     the input overwrites the data file at the offset its next 4 bytes give.
// Opening may fail with kvdrive::Error and reads may too (a checksum miss, a page recovery
// dropped), but a read that succeeds must return exactly the bytes written for that key: wrong
// data is a finding (the target aborts). The erased page may come back with its bytes: a
// damaged log can lose the erase record. A sealed log is well formed by construction and may
// name any stored page under any key (the checksums catch damage, not forgery), so there a read
// that succeeds must return the bytes of some page the template wrote: never other bytes.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "mem_file.hpp"
#include "ssd_store.hpp"

namespace {

using namespace kvdrive::fuzz;

/// The template store's files, written once.
std::shared_ptr<MemDisk> template_store(const std::string& path) {
  auto disk = std::make_shared<MemDisk>();
  write_store(path, MemFile(disk));
  return disk;
}

/// Writes `bytes` into `f` at `at`, growing it as a write past its end does.
void overwrite(std::vector<std::byte>& f, std::size_t at, const std::uint8_t* bytes, std::size_t n) {
  if (n == 0) return;
  if (f.size() < at + n) f.resize(at + n);
  std::memcpy(f.data() + at, bytes, n);
}

/// Recomputes the checksum of every record in the log's blocks (those not marked empty).
void reseal(std::vector<std::uint8_t>& log) {
  using kvdrive::tier::ssd_format::LogRecord;
  constexpr std::size_t kBlock = 4096, kPerBlock = kBlock / sizeof(LogRecord);
  for (std::size_t b = 0; b + kBlock <= log.size(); b += kBlock)
    for (std::size_t i = 0; i < kPerBlock; ++i) {
      LogRecord r;
      std::memcpy(&r, log.data() + b + i * sizeof r, sizeof r);
      if (r.sequence == 0) continue;
      r.checksum = r.compute_checksum();
      std::memcpy(log.data() + b + i * sizeof r, &r, sizeof r);
    }
}

/// The bytes the template wrote for key_of(i), i < kStorePages, made once: building them per
/// read (instrumented) was a third of the target's time.
const std::vector<std::vector<std::byte>>& template_pages() {
  static const std::vector<std::vector<std::byte>> pages = [] {
    std::vector<std::vector<std::byte>> v;
    for (std::size_t i = 0; i < kStorePages; ++i) v.push_back(page_bytes(key_of(i)));
    return v;
  }();
  return pages;
}

/// True if `bytes` are the bytes of a page the template wrote (under any key).
bool some_page(const std::vector<std::byte>& bytes) {
  for (const auto& p : template_pages())
    if (std::memcmp(bytes.data(), p.data(), kStorePage) == 0) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static const std::string path = "/kvd/fuzz.store";
  static const std::shared_ptr<MemDisk> tmpl = template_store(path);
  const std::shared_ptr<MemDisk> disk = tmpl->clone();
  const bool sealed = data[0] % 4 == 2;
  if (data[0] % 2 == 0) {
    std::vector<std::uint8_t> log(data + 1, data + size);
    if (sealed) reseal(log);
    std::vector<std::byte>& f = disk->file(path + ".log");
    f.resize(4096);
    overwrite(f, 4096, log.data(), log.size());
  } else {
    if (size < 5) return 0;
    std::uint32_t at = 0;
    std::memcpy(&at, data + 1, 4);
    std::vector<std::byte>& f = disk->file(path);
    overwrite(f, at % (f.size() + 1), data + 5, size - 5);
  }
  try {
    kvdrive::tier::BasicSsdTier<MemFile> t(store_params(path), MemFile(disk));
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
      if (sealed ? !some_page(got) : (i >= kStorePages || std::memcmp(got.data(), template_pages()[i].data(), kStorePage) != 0)) std::abort();
    }
  } catch (const kvdrive::Error&) {
  }
  return 0;
}
