// PrefixStore's page files (tier/prefix_store.hpp declares these members and includes this header
// at its end). store() writes a page key's file whole under a temporary name, syncs it and renames
// it into place, so a crash leaves a whole file or none; it makes room first, least recently used
// files out, never the prompt's own. read_file() reads pages back and checks the file's header and
// each page's checksum: a file that is short, has a bad header or a page that fails its checksum
// is a miss ("corrupt"), never data, and is deleted so that the page is stored again.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/prefix_store.hpp"
#include "kvdrive/tier/prefix_store/file.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier {

/// Writes a page key's file (temporary name, sync, rename); true if it was stored.
inline bool PrefixStore::store(const PrefixDigest& key, const std::string& name, const Pending& pend, PageChain chain, std::set<std::string>& own) {
  const std::uint64_t bytes = file_bytes();
  if (!make_room(bytes, chain, own)) {
    stats_.over_budget += streams();
    return false;
  }
  prefix_store::FileHeader h{};
  std::memcpy(h.magic, prefix_store::FileHeader::kMagic, 8);
  h.page_bytes = static_cast<std::uint32_t>(g_.page_bytes), h.layers = g_.layers, h.heads = g_.kv_heads;
  h.model_low = p_.model.low, h.model_high = p_.model.high, h.page_low = key.low, h.page_high = key.high;
  h.checksum = h.sum();
  std::vector<std::uint64_t> sums(streams());
  for (std::size_t s = 0; s < sums.size(); ++s) sums[s] = prefix_store::page_sum(key, s, pend.bytes.data() + s * g_.page_bytes, g_.page_bytes);
  const std::string tmp = fmt::format("{}/.tmp-{}-{}", p_.dir, ::getpid(), ++temporaries_);
  const std::int64_t now = next_stamp();
  bool ok = false;
  {
    prefix_store::Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    ok = f.fd >= 0 && prefix_store::pwrite_all(f.fd, &h, sizeof h, 0) && prefix_store::pwrite_all(f.fd, sums.data(), sums.size() * 8, sizeof h) &&
         prefix_store::pwrite_all(f.fd, pend.bytes.data(), pend.bytes.size(), static_cast<off_t>(sizeof h + sums.size() * 8)) &&
         (!p_.sync || ::fdatasync(f.fd) == 0);
    if (ok) prefix_store::set_mtime(f.fd, now);
  }
  ok = ok && ::rename(tmp.c_str(), (p_.dir + "/" + name).c_str()) == 0;
  if (!ok) {
    (void)::unlink(tmp.c_str());
    stats_.write_errors += streams();
    return false;
  }
  add_entry(name, bytes, now);
  stats_.written += streams();
  stats_.bytes_written += pend.bytes.size();
  return true;
}

/// Reads the pages `which` of one page key's file into their buffers; true if all were read.
inline bool PrefixStore::read_file(const PrefixDigest& key, std::span<const ReadRequest> reads, const std::vector<std::size_t>& which,
                                   std::vector<RemoteRead>& out) {
  const std::string name = file_name(key);
  const auto it = entries_.find(name);
  if (it == entries_.end()) return false;  // missing
  const std::string path = p_.dir + "/" + name;
  prefix_store::Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    for (std::size_t i : which) out[i] = errno == ENOENT ? RemoteRead::missing : RemoteRead::error;
    if (errno == ENOENT) drop_entry(name);
    return false;
  }
  prefix_store::FileHeader h{};
  struct stat st {};
  const bool header_ok = ::fstat(f.fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == file_bytes() &&
                         prefix_store::pread_all(f.fd, &h, sizeof h, 0) && std::memcmp(h.magic, prefix_store::FileHeader::kMagic, 8) == 0 &&
                         h.checksum == h.sum() && h.page_bytes == g_.page_bytes && h.layers == g_.layers && h.heads == g_.kv_heads &&
                         h.model_low == p_.model.low && h.model_high == p_.model.high && h.page_low == key.low && h.page_high == key.high;
  // The page checksums, read once for the file.
  sums_.resize(streams());
  bool damaged = !header_ok || !prefix_store::pread_all(f.fd, sums_.data(), sums_.size() * 8, sizeof h);
  for (std::size_t i : which) {
    if (damaged) {
      out[i] = RemoteRead::corrupt;
      continue;
    }
    const PageKey& k = reads[i].key;
    if (k.layer >= g_.layers || k.head >= g_.kv_heads) {
      out[i] = RemoteRead::missing;
      continue;
    }
    const std::size_t slot = static_cast<std::size_t>(k.layer) * g_.kv_heads + k.head;
    page_.resize(g_.page_bytes);
    const off_t at = static_cast<off_t>(sizeof h + streams() * 8 + slot * g_.page_bytes);
    if (!prefix_store::pread_all(f.fd, page_.data(), g_.page_bytes, at) ||
        prefix_store::page_sum(key, slot, page_.data(), g_.page_bytes) != sums_[slot]) {
      damaged = true;
      out[i] = RemoteRead::corrupt;
      continue;
    }
    std::memcpy(reads[i].dst, page_.data(), g_.page_bytes);  // the caller's buffer only ever gets checked bytes
    out[i] = RemoteRead::hit;
  }
  if (damaged) {  // never used; deleted so that the page is stored again
    for (std::size_t i : which) out[i] = RemoteRead::corrupt;
    f = prefix_store::Fd();
    (void)::unlink(path.c_str());
    drop_entry(name);
    return false;
  }
  return true;
}

}  // namespace kvdrive::tier
