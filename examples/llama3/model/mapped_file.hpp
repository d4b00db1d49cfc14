// MappedFile: a read-only memory map of a whole file (weights are used in place, not copied).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    KVD_EXPECT(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail("{}: cannot stat: {}", path, std::strerror(err));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      KVD_EXPECT(p != MAP_FAILED, "{}: cannot map {} bytes: {}", path, size_, std::strerror(err));
      data_ = static_cast<const std::byte*>(p);
    } else {
      ::close(fd);
    }
  }
  MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  }

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvdrive::llama
