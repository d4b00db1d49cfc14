// A GGUF writer for the tests and the fuzz targets. The repository keeps no binary fixtures: the
// small GGUF files the tests read are committed in a text form (tests/data/**/*.gguf.json, which
// scripts/gguf_json.py makes from the files gguf-py's GGUFWriter wrote), and this header writes
// the bytes back from it, laid out as GGUFWriter lays them out: header, metadata, tensor infos,
// zeros up to the alignment, then each tensor's bytes padded with zeros to the alignment. The
// text form names the sha256 of the file it came from, so a test can check it got the very same
// bytes.
//
// It does not use the reader under test (examples/llama3/model/gguf.hpp): the format's type ids are
// spelt out here, and a tensor's type is the id the text form gives.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvdrive::test {

/// The bytes of a GGUF file (little-endian, version 2 or 3), built up key by key and tensor by tensor.
class GgufWriter {
 public:
  explicit GgufWriter(std::uint32_t version = 3, std::uint64_t alignment = 32) : version_(version), alignment_(alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) throw std::invalid_argument("GgufWriter: the alignment must be a power of two");
  }

  /// A metadata key: its value type id and the value's bytes (gguf_value_bytes makes them from JSON).
  void add_kv(std::string_view key, std::uint32_t type, const std::string& value) {
    kv_ += string(key) + u32(type) + value;
    ++n_kv_;
  }

  /// A tensor: its GGML type id, its dimensions (ne0 first) and its bytes. Offsets follow the
  /// order of the calls, each tensor starting at a multiple of the alignment.
  void add_tensor(std::string_view name, std::uint32_t type, const std::vector<std::uint64_t>& dims, const std::string& data) {
    infos_ += string(name) + u32(static_cast<std::uint32_t>(dims.size()));
    for (const std::uint64_t d : dims) infos_ += u64(d);
    infos_ += u32(type) + u64(data_.size());
    data_ += data;
    data_.resize(padded(data_.size()), '\0');
    ++n_tensors_;
  }

  std::string bytes() const {
    std::string out = "GGUF" + u32(version_) + u64(n_tensors_) + u64(n_kv_) + kv_ + infos_;
    out.resize(padded(out.size()), '\0');
    return out + data_;
  }

  static std::string u32(std::uint32_t v) { return le(v); }
  static std::string u64(std::uint64_t v) { return le(v); }
  /// A GGUF string: its length (u64), then its bytes.
  static std::string string(std::string_view s) { return u64(s.size()) + std::string(s); }

  /// The little-endian bytes of an integer or a float.
  template <class T>
  static std::string le(T v) {
    static_assert(std::is_arithmetic_v<T>);
    std::array<unsigned char, sizeof(T)> b;
    std::memcpy(b.data(), &v, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(b.begin(), b.end());
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

 private:
  std::size_t padded(std::size_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  std::uint32_t version_;
  std::uint64_t alignment_;
  std::uint64_t n_kv_ = 0, n_tensors_ = 0;
  std::string kv_, infos_, data_;
};

namespace gguf_text {

using nlohmann::json;

/// The GGUF value type ids, in the format's numbering.
inline constexpr std::array<std::string_view, 13> kValueTypes = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                                                 "bool",  "string", "array",  "uint64", "int64",  "float64"};

[[noreturn]] inline void bad(const std::string& what) { throw std::runtime_error("GGUF text form: " + what); }

/// The id of a value type name ("array[...]" is an array).
inline std::uint32_t type_id(std::string_view type) {
  if (type.starts_with("array[")) return 9;
  for (std::size_t i = 0; i < kValueTypes.size(); ++i)
    if (kValueTypes[i] == type && i != 9) return static_cast<std::uint32_t>(i);
  bad("unknown value type '" + std::string(type) + "'");
}

/// Bytes from hex ("0aff..."), two digits each.
inline std::string from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) bad("odd-length hex");
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    bad(std::string("not a hex digit: '") + c + "'");
  };
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]));
  return out;
}

/// A byte string: a JSON string (its UTF-8 bytes) or {"hex": ...}.
inline std::string text_bytes(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("hex") && v.size() == 1) return from_hex(v.at("hex").get<std::string>());
  bad("expected a string or {\"hex\": ...}, got " + v.dump());
}

template <class T>
std::string integer(const json& v, std::string_view type) {
  if (!v.is_number_integer()) bad("expected an integer for " + std::string(type) + ", got " + v.dump());
  if (v.is_number_unsigned()) {
    const auto x = v.get<std::uint64_t>();
    if (x > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) bad(v.dump() + " is out of the " + std::string(type) + " range");
    return GgufWriter::le(static_cast<T>(x));
  }
  const auto x = v.get<std::int64_t>();
  if (x < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
      (x > 0 && static_cast<std::uint64_t>(x) > static_cast<std::uint64_t>(std::numeric_limits<T>::max())))
    bad(v.dump() + " is out of the " + std::string(type) + " range");
  return GgufWriter::le(static_cast<T>(x));
}

/// The bytes of a value of the given type (without its type id). Arrays: "array[T]", whose
/// items are values of T (T may be an array type again).
inline std::string value_bytes(std::string_view type, const json& v) {
  if (type.starts_with("array[")) {
    if (!type.ends_with("]")) bad("bad array type '" + std::string(type) + "'");
    if (!v.is_array()) bad("expected an array for " + std::string(type) + ", got " + v.dump());
    const std::string_view element = type.substr(6, type.size() - 7);
    std::string out = GgufWriter::u32(type_id(element)) + GgufWriter::u64(v.size());
    for (const json& item : v) out += value_bytes(element, item);
    return out;
  }
  switch (type_id(type)) {
    case 0: return integer<std::uint8_t>(v, type);
    case 1: return integer<std::int8_t>(v, type);
    case 2: return integer<std::uint16_t>(v, type);
    case 3: return integer<std::int16_t>(v, type);
    case 4: return integer<std::uint32_t>(v, type);
    case 5: return integer<std::int32_t>(v, type);
    case 10: return integer<std::uint64_t>(v, type);
    case 11: return integer<std::int64_t>(v, type);
    case 6:  // rounded to the nearest float32, as gguf-py's struct.pack("<f") does; the text form holds exact float32 values
      if (!v.is_number()) bad("expected a number for float32, got " + v.dump());
      return GgufWriter::le(static_cast<float>(v.get<double>()));
    case 12:
      if (!v.is_number()) bad("expected a number for float64, got " + v.dump());
      return GgufWriter::le(v.get<double>());
    case 7:
      if (!v.is_boolean()) bad("expected a bool, got " + v.dump());
      return std::string(1, v.get<bool>() ? '\1' : '\0');
    case 8: return GgufWriter::string(text_bytes(v));
    default: bad("unknown value type '" + std::string(type) + "'");
  }
}

}  // namespace gguf_text

/// The bytes of the GGUF file a text form describes (scripts/gguf_json.py documents the form).
inline std::string gguf_from_text(const nlohmann::json& spec) {
  using nlohmann::json;
  GgufWriter w(spec.at("version").get<std::uint32_t>(), spec.at("alignment").get<std::uint64_t>());
  for (const json& kv : spec.at("kv")) {
    const std::string type = kv.at("type").get<std::string>();
    w.add_kv(gguf_text::text_bytes(kv.at("key")), gguf_text::type_id(type), gguf_text::value_bytes(type, kv.at("value")));
  }
  for (const json& t : spec.at("tensors")) {
    std::string hex;
    for (const json& line : t.at("data")) hex += line.get<std::string>();
    w.add_tensor(gguf_text::text_bytes(t.at("name")), t.at("type_id").get<std::uint32_t>(), t.at("dims").get<std::vector<std::uint64_t>>(),
                 gguf_text::from_hex(hex));
  }
  return w.bytes();
}

/// Reads a text form (a .gguf.json file).
inline nlohmann::json read_gguf_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return nlohmann::json::parse(in);
}

/// Writes bytes to a file (replacing it).
inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace kvdrive::test
