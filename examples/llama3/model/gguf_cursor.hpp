// The bounded reading under the GGUF reader (gguf.hpp): a cursor over the mapped file that checks
// every read against the bytes that remain, and names what it was reading when they do not
// suffice. Values are decoded in place (little-endian, as the files are).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

static_assert(std::endian::native == std::endian::little, "the GGUF reader decodes little-endian files in place");

namespace gguf_detail {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// A non-owning reference to a callable giving a description (for messages): it keeps the
/// recursive parse of nested arrays from instantiating a template per nesting level.
class Describe {
 public:
  template <class F>
  Describe(const F& f) : obj_(&f), call_([](const void* o) { return (*static_cast<const F*>(o))(); }) {}  // NOLINT: implicit
  std::string operator()() const { return call_(obj_); }

 private:
  const void* obj_;
  std::string (*call_)(const void*);
};

/// A bounded reader over [base, base + size). `describe` callables name what is read, for the
/// message of a read past the end (they run only on failure).
class Cursor {
 public:
  Cursor(const std::byte* base, std::size_t size, std::size_t pos, const std::string& path) : base_(base), size_(size), pos_(pos), path_(path) {}

  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }
  const std::byte* here() const { return base_ + pos_; }
  const std::string& path() const { return path_; }

  template <class D>
  void need(std::uint64_t n, const D& describe) const {
    if (n > left()) fail("{}: truncated: {} at byte {} needs {} bytes, only {} remain (file of {} bytes)", path_, describe(), pos_, n, left(), size_);
  }
  template <class D>
  void skip(std::uint64_t n, const D& describe) {
    need(n, describe);
    pos_ += static_cast<std::size_t>(n);
  }
  template <class T, class D>
  T read(const D& describe) {
    need(sizeof(T), describe);
    const T v = load<T>(base_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  /// A length-prefixed string (a view into the file).
  template <class D>
  std::string_view string(const D& describe) {
    const auto n = read<std::uint64_t>([&] { return describe() + "'s length"; });
    need(n, [&] { return fmt::format("{} of {} bytes", describe(), n); });
    const std::string_view s(reinterpret_cast<const char*>(base_ + pos_), static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

 private:
  const std::byte* base_;
  std::size_t size_;
  std::size_t pos_;
  const std::string& path_;
};

}  // namespace gguf_detail

}  // namespace kvdrive::llama
