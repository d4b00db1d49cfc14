// A reader for GGUF files (the ggml model format): the header (magic "GGUF", version 2 or 3,
// tensor and key counts), typed metadata key/values, tensor infos (name, dimensions, GGML type,
// offset) and the aligned tensor data. The file is mapped, never copied: metadata values and
// tensor data are views into the map, decoded on demand.
//
// Everything is validated when the file is opened, before anything is allocated from a count the
// file gives: every length and count is bounded by the bytes that remain, every size is computed
// with checked arithmetic, every tensor lies inside the file, aligned and apart from the others.
// A malformed file gives a kvdrive::Error naming the file, what was wrong, the value found and
// what was expected; never a crash and never a huge allocation.
//
// Layout (all little-endian; v2 and v3 are the same for little-endian files, v3 only adds
// big-endian ones, which this reader refuses):
//   u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
//   kv_count x { string key, u32 value_type, value },
//   tensor_count x { string name, u32 n_dims, u64 dims[n_dims] (ne0 first), u32 ggml_type, u64 offset },
//   padding to `general.alignment` (default 32), tensor data (each offset a multiple of the alignment).
// A string is a u64 byte length and the bytes (no terminator, not validated as UTF-8); an array is
// a u32 element type, a u64 count and the elements (arrays may nest).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ggml_type.hpp"
#include "kvdrive/core/error.hpp"
#include "mapped_file.hpp"

namespace kvdrive::llama {

static_assert(std::endian::native == std::endian::little, "the GGUF reader decodes little-endian files in place");

/// GGUF metadata value types, with the ids files store.
enum class GgufValueType : std::uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6, boolean = 7,
  string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12,
};

/// The name of a value type id ("uint32", "bool", "string", "array", ...), nullptr if unknown.
constexpr const char* gguf_value_type_name(std::uint32_t id) {
  constexpr const char* names[] = {"uint8", "int8",  "uint16", "int16",  "uint32", "int32", "float32",
                                   "bool",  "string", "array", "uint64", "int64",  "float64"};
  return id < 13 ? names[id] : nullptr;
}
constexpr const char* gguf_value_type_name(GgufValueType t) { return gguf_value_type_name(static_cast<std::uint32_t>(t)); }

/// Bytes of a scalar of type t; 0 for string and array.
constexpr std::size_t gguf_scalar_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::uint8: case GgufValueType::int8: case GgufValueType::boolean: return 1;
    case GgufValueType::uint16: case GgufValueType::int16: return 2;
    case GgufValueType::uint32: case GgufValueType::int32: case GgufValueType::float32: return 4;
    case GgufValueType::uint64: case GgufValueType::int64: case GgufValueType::float64: return 8;
    default: return 0;
  }
}

/// Bytes (at most `max` of them) of a string from a file, for messages: printable ASCII as is,
/// everything else as \xHH, longer ones cut with "..." and their length.
inline std::string gguf_printable(std::string_view s, std::size_t max = 80) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > max) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

/// A double as float, saturating to +-infinity past float's range (where a plain conversion is
/// undefined behaviour).
inline float gguf_to_float(double x) {
  constexpr float max = std::numeric_limits<float>::max();
  if (x > max) return std::numeric_limits<float>::infinity();
  if (x < -max) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(x);
}

namespace gguf_detail {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Fewest bytes an element of type t can take (for bounding counts before walking them).
constexpr std::size_t min_encoded_bytes(GgufValueType t) {
  if (t == GgufValueType::string) return 8;   // the length
  if (t == GgufValueType::array) return 12;   // element type + count
  return gguf_scalar_bytes(t);
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
  Cursor(const std::byte* base, std::size_t size, std::size_t pos, const std::string& path)
      : base_(base), size_(size), pos_(pos), path_(path) {}

  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }
  const std::byte* here() const { return base_ + pos_; }
  const std::string& path() const { return path_; }

  template <class D>
  void need(std::uint64_t n, const D& describe) const {
    if (n > left())
      fail("{}: truncated: {} at byte {} needs {} bytes, only {} remain (file of {} bytes)", path_, describe(), pos_, n,
           left(), size_);
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

/// Nested arrays deeper than this are refused (each level would recurse).
inline constexpr int kGgufMaxArrayDepth = 16;

/// A metadata value: a view into the mapped file (valid while the GgufFile's map lives). Values
/// come from GgufFile, which validated them; the accessors throw kvdrive::Error on a wrong type.
struct GgufValue {
  GgufValueType type = GgufValueType::uint8;
  GgufValueType element_type = GgufValueType::uint8;  ///< arrays only
  const std::byte* data = nullptr;  ///< scalar: its bytes; string: its bytes (after the length); array: its first element
  std::uint64_t length = 1;         ///< string: bytes; array: elements; scalar: 1
  std::size_t bytes = 0;            ///< bytes spanned from `data` (an array: all of its elements)

  bool is_integer() const {
    switch (type) {
      case GgufValueType::uint8: case GgufValueType::int8: case GgufValueType::uint16: case GgufValueType::int16:
      case GgufValueType::uint32: case GgufValueType::int32: case GgufValueType::uint64: case GgufValueType::int64:
        return true;
      default: return false;
    }
  }
  bool is_float() const { return type == GgufValueType::float32 || type == GgufValueType::float64; }
  bool is_number() const { return is_integer() || is_float(); }
  bool is_string() const { return type == GgufValueType::string; }
  bool is_bool() const { return type == GgufValueType::boolean; }
  bool is_array() const { return type == GgufValueType::array; }

  /// "uint32", "string", "array[string; 49152]", "array[array; 2]", ...
  std::string type_name() const {
    if (!is_array()) return gguf_value_type_name(type);
    return fmt::format("array[{}; {}]", gguf_value_type_name(element_type), length);
  }

  /// An integer value as int64 (a uint64 past the int64 range is an error).
  std::int64_t as_int() const {
    using gguf_detail::load;
    switch (type) {
      case GgufValueType::uint8: return load<std::uint8_t>(data);
      case GgufValueType::int8: return load<std::int8_t>(data);
      case GgufValueType::uint16: return load<std::uint16_t>(data);
      case GgufValueType::int16: return load<std::int16_t>(data);
      case GgufValueType::uint32: return load<std::uint32_t>(data);
      case GgufValueType::int32: return load<std::int32_t>(data);
      case GgufValueType::int64: return load<std::int64_t>(data);
      case GgufValueType::uint64: {
        const auto u = load<std::uint64_t>(data);
        KVD_EXPECT(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                   "GGUF value {} is past the int64 range", u);
        return static_cast<std::int64_t>(u);
      }
      default: fail("GGUF value of type {} is not an integer", type_name());
    }
  }
  /// A non-negative integer value as uint64 (any integer type; a negative one is an error).
  std::uint64_t as_uint() const {
    if (type == GgufValueType::uint64) return gguf_detail::load<std::uint64_t>(data);
    const std::int64_t v = as_int();
    KVD_EXPECT(v >= 0, "GGUF value {} is negative, expected an unsigned integer", v);
    return static_cast<std::uint64_t>(v);
  }
  /// A number (float32, float64 or any integer) as double.
  double as_double() const {
    if (type == GgufValueType::float32) return gguf_detail::load<float>(data);
    if (type == GgufValueType::float64) return gguf_detail::load<double>(data);
    if (type == GgufValueType::uint64) return static_cast<double>(gguf_detail::load<std::uint64_t>(data));
    KVD_EXPECT(is_integer(), "GGUF value of type {} is not a number", type_name());
    return static_cast<double>(as_int());
  }
  bool as_bool() const {
    KVD_EXPECT(is_bool(), "GGUF value of type {} is not a bool", type_name());
    return gguf_detail::load<std::uint8_t>(data) != 0;
  }
  /// The string's bytes (a view into the file).
  std::string_view as_string() const {
    KVD_EXPECT(is_string(), "GGUF value of type {} is not a string", type_name());
    return {reinterpret_cast<const char*>(data), static_cast<std::size_t>(length)};
  }

  /// Calls f(const GgufValue&) for each element of an array, in order.
  template <class F>
  void for_each_item(F&& f) const {
    KVD_EXPECT(is_array(), "GGUF value of type {} is not an array", type_name());
    static const std::string where = "GGUF array";
    gguf_detail::Cursor c(data, bytes, 0, where);
    for (std::uint64_t i = 0; i < length; ++i) f(parse(c, element_type, 0, [] { return std::string("an array element"); }));
  }
  /// The elements of an array (nested arrays stay GgufValues).
  std::vector<GgufValue> items() const {
    std::vector<GgufValue> out;
    out.reserve(static_cast<std::size_t>(is_array() ? length : 0));
    for_each_item([&](const GgufValue& v) { out.push_back(v); });
    return out;
  }

  /// The value for display: scalars as numbers, strings quoted (escaped, cut after 60 bytes),
  /// arrays as their first `max_items` elements and their count.
  std::string to_string(std::size_t max_items = 8) const {
    switch (type) {
      case GgufValueType::float32: return fmt::format("{}", gguf_detail::load<float>(data));
      case GgufValueType::float64: return fmt::format("{}", gguf_detail::load<double>(data));
      case GgufValueType::boolean: return as_bool() ? "true" : "false";
      case GgufValueType::uint64: return fmt::format("{}", gguf_detail::load<std::uint64_t>(data));
      case GgufValueType::string: return fmt::format("'{}'", gguf_printable(as_string(), 60));  // (operator+ here trips GCC 12's -Wrestrict)
      case GgufValueType::array: {
        std::string s = "[";
        std::size_t i = 0;
        for_each_item([&](const GgufValue& v) {
          if (i < max_items) s += (i ? ", " : "") + v.to_string(max_items);
          ++i;
        });
        if (length > max_items) s += fmt::format(", ... ({} items)", length);
        return s + "]";
      }
      default: return fmt::format("{}", as_int());
    }
  }

  /// Reads (and validates) a value of type `type` at the cursor. Used by GgufFile on the whole
  /// file and by for_each_item on a validated array.
  static GgufValue parse(gguf_detail::Cursor& c, GgufValueType type, int depth, gguf_detail::Describe describe) {
    GgufValue v;
    v.type = type;
    if (const std::size_t n = gguf_scalar_bytes(type); n != 0) {
      c.need(n, describe);
      v.data = c.here();
      v.bytes = n;
      if (type == GgufValueType::boolean) {
        const auto b = gguf_detail::load<std::uint8_t>(v.data);
        KVD_EXPECT(b <= 1, "{}: {} at byte {}: bool byte is {}, expected 0 or 1", c.path(), describe(), c.pos(), b);
      }
      c.skip(n, describe);
      return v;
    }
    if (type == GgufValueType::string) {
      const std::string_view s = c.string(describe);
      v.data = reinterpret_cast<const std::byte*>(s.data());
      v.length = s.size();
      v.bytes = s.size();
      return v;
    }
    // An array: element type, count, elements.
    const std::size_t at = c.pos();
    const auto et = c.read<std::uint32_t>([&] { return describe() + "'s element type"; });
    KVD_EXPECT(gguf_value_type_name(et) != nullptr, "{}: {} at byte {}: unknown array element type {} (expected 0..12)",
               c.path(), describe(), at, et);
    v.element_type = static_cast<GgufValueType>(et);
    const auto n = c.read<std::uint64_t>([&] { return describe() + "'s element count"; });
    const std::size_t min = gguf_detail::min_encoded_bytes(v.element_type);
    KVD_EXPECT(n <= c.left() / min, "{}: {} at byte {}: an array of {} {} elements needs at least {} bytes per element, but only {} bytes remain",
               c.path(), describe(), at, n, gguf_value_type_name(et), min, c.left());
    if (v.element_type == GgufValueType::array)
      KVD_EXPECT(depth + 1 < kGgufMaxArrayDepth, "{}: {} at byte {}: arrays nested more than {} deep", c.path(), describe(), at,
                 kGgufMaxArrayDepth);
    v.length = n;
    v.data = c.here();
    const std::size_t first = c.pos();
    if (gguf_scalar_bytes(v.element_type) != 0 && v.element_type != GgufValueType::boolean) {
      c.skip(n * min, describe);  // n * min <= left: no overflow
    } else {
      for (std::uint64_t i = 0; i < n; ++i)
        parse(c, v.element_type, depth + 1, [&] { return fmt::format("element {} of {}", i, describe()); });
    }
    v.bytes = c.pos() - first;
    return v;
  }
};

struct GgufKv {
  std::string key;
  GgufValue value;
  std::size_t offset = 0;  ///< file offset of the key
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<std::int64_t> dims;  ///< ne0 first, as GGUF stores them: [cols, rows] for a matrix
  std::int64_t elements = 0;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;        ///< relative to the start of the tensor data
  const std::byte* data = nullptr; ///< in the mapped file

  std::int64_t cols() const { return dims.empty() ? 0 : dims[0]; }
  /// The product of the dims after the first (1 for a vector).
  std::int64_t rows() const { return cols() > 0 ? elements / cols() : 0; }
  /// "[576, 49152]" (ne0 first).
  std::string shape() const { return fmt::format("[{}]", fmt::join(dims, ", ")); }
};

class GgufFile {
 public:
  static constexpr std::uint64_t kDefaultAlignment = 32;
  static constexpr std::uint64_t kMaxKeyBytes = 65535;

  explicit GgufFile(const std::string& path) : file_(std::make_shared<MappedFile>(path)) { parse(); }

  const std::string& path() const { return file_->path(); }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  /// The file offset where tensor data starts (offsets of tensors are relative to it).
  std::uint64_t data_offset() const { return data_offset_; }
  /// The mapped file (tensor data points into it; keep it to keep the data).
  std::shared_ptr<MappedFile> file() const { return file_; }

  // --- metadata ---

  /// Every key/value, in file order.
  const std::vector<GgufKv>& metadata() const { return kvs_; }
  bool has(std::string_view key) const { return kv_index_.find(key) != kv_index_.end(); }
  /// The value of a key, nullptr if absent.
  const GgufValue* find(std::string_view key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
  }

  // Typed getters: nullopt when the key is absent; a kvdrive::Error naming the file, the key,
  // its type and the type expected when it has another type.

  /// Any integer type (a uint64 past the int64 range is an error).
  std::optional<std::int64_t> get_int(std::string_view key) const {
    const GgufValue* v = typed(key, &GgufValue::is_integer, "an integer");
    if (!v) return std::nullopt;
    if (v->type == GgufValueType::uint64)
      KVD_EXPECT(v->as_uint() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                 "{}: metadata '{}' is {}, past the int64 range", path(), gguf_printable(key), v->as_uint());
    return v->as_int();
  }
  /// Any non-negative integer.
  std::optional<std::uint64_t> get_uint(std::string_view key) const {
    const GgufValue* v = typed(key, &GgufValue::is_integer, "an integer");
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::uint64)
      KVD_EXPECT(v->as_int() >= 0, "{}: metadata '{}' is {}, expected a non-negative integer", path(), gguf_printable(key),
                 v->as_int());
    return v->as_uint();
  }
  /// float32, float64 or any integer, as double.
  std::optional<double> get_float(std::string_view key) const {
    const GgufValue* v = typed(key, &GgufValue::is_number, "a number");
    return v ? std::optional<double>(v->as_double()) : std::nullopt;
  }
  std::optional<bool> get_bool(std::string_view key) const {
    const GgufValue* v = typed(key, &GgufValue::is_bool, "a bool");
    return v ? std::optional<bool>(v->as_bool()) : std::nullopt;
  }
  std::optional<std::string> get_string(std::string_view key) const {
    const GgufValue* v = typed(key, &GgufValue::is_string, "a string");
    return v ? std::optional<std::string>(std::string(v->as_string())) : std::nullopt;
  }
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const {
    const GgufValue* v = array_of(key, "strings", [](const GgufValue& e) { return e.is_string(); });
    if (!v) return std::nullopt;
    std::vector<std::string> out;
    out.reserve(static_cast<std::size_t>(v->length));
    v->for_each_item([&](const GgufValue& e) { out.emplace_back(e.as_string()); });
    return out;
  }
  /// An array of float32 or float64 (converted to float, saturating) or of integers.
  std::optional<std::vector<float>> get_float_array(std::string_view key) const {
    const GgufValue* v = array_of(key, "numbers", [](const GgufValue& e) { return e.is_number(); });
    if (!v) return std::nullopt;
    std::vector<float> out;
    out.reserve(static_cast<std::size_t>(v->length));
    v->for_each_item([&](const GgufValue& e) { out.push_back(gguf_to_float(e.as_double())); });
    return out;
  }
  /// An array of any integer type (uint64 elements past the int64 range are an error).
  std::optional<std::vector<std::int64_t>> get_int_array(std::string_view key) const {
    const GgufValue* v = array_of(key, "integers", [](const GgufValue& e) { return e.is_integer(); });
    if (!v) return std::nullopt;
    std::vector<std::int64_t> out;
    out.reserve(static_cast<std::size_t>(v->length));
    std::uint64_t i = 0;
    v->for_each_item([&](const GgufValue& e) {
      if (e.type == GgufValueType::uint64)
        KVD_EXPECT(e.as_uint() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                   "{}: metadata '{}' element {} is {}, past the int64 range", path(), gguf_printable(key), i, e.as_uint());
      out.push_back(e.as_int());
      ++i;
    });
    return out;
  }

  // The same, for keys that must be present.
  std::int64_t require_int(std::string_view key) const { return required(get_int(key), key, "an integer"); }
  double require_float(std::string_view key) const { return required(get_float(key), key, "a number"); }
  std::string require_string(std::string_view key) const { return required(get_string(key), key, "a string"); }

  // --- tensors ---

  /// Every tensor, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }

 private:
  const GgufValue* typed(std::string_view key, bool (GgufValue::*is)() const, const char* expected) const {
    const GgufValue* v = find(key);
    if (v != nullptr)
      KVD_EXPECT((v->*is)(), "{}: metadata '{}' is {}, expected {}", path(), gguf_printable(key), v->type_name(), expected);
    return v;
  }
  template <class Pred>
  const GgufValue* array_of(std::string_view key, const char* what, Pred ok) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return nullptr;
    bool good = v->is_array();
    if (good && v->length > 0) {  // the element type decides; probe it with a zero-count view
      GgufValue probe;
      probe.type = v->element_type;
      good = ok(probe);
    }
    KVD_EXPECT(good, "{}: metadata '{}' is {}, expected an array of {}", path(), gguf_printable(key), v->type_name(), what);
    return v;
  }
  template <class T>
  T required(std::optional<T> v, std::string_view key, const char* what) const {
    KVD_EXPECT(v.has_value(), "{}: metadata '{}' ({}) is missing", path(), gguf_printable(key), what);
    return std::move(*v);
  }

  void parse() {
    const std::string& p = file_->path();
    const std::byte* base = file_->data();
    const std::size_t size = file_->size();
    gguf_detail::Cursor c(base, size, 0, p);

    KVD_EXPECT(size >= 4, "{}: {} bytes: too short for a GGUF file (no 4-byte magic \"GGUF\")", p, size);
    if (std::memcmp(base, "GGUF", 4) != 0) {
      const auto* b = reinterpret_cast<const unsigned char*>(base);
      fail("{}: not a GGUF file: the magic bytes are {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 (\"GGUF\")", p, b[0],
           b[1], b[2], b[3]);
    }
    c.skip(4, [] { return std::string("the magic"); });
    version_ = c.read<std::uint32_t>([] { return std::string("the version"); });
    if (version_ == 1)
      fail("{}: GGUF version 1 is not supported (its 32-bit counts predate version 2); expected version 2 or 3 (re-convert the model)", p);
    if (version_ == 0x02000000u || version_ == 0x03000000u)
      fail("{}: a big-endian GGUF file (version field {:#010x}); only little-endian files are supported", p, version_);
    KVD_EXPECT(version_ == 2 || version_ == 3, "{}: GGUF version {} is not supported; expected version 2 or 3", p, version_);
    const auto tensor_count = c.read<std::uint64_t>([] { return std::string("the tensor count"); });
    const auto kv_count = c.read<std::uint64_t>([] { return std::string("the metadata key count"); });
    // Each key/value takes at least 13 bytes (length, type, a 1-byte value), each tensor info 32.
    KVD_EXPECT(kv_count <= c.left() / 13, "{}: the header claims {} metadata keys, but the {} bytes after it hold at most {}", p,
               kv_count, c.left(), c.left() / 13);
    KVD_EXPECT(tensor_count <= c.left() / 32, "{}: the header claims {} tensors, but the {} bytes after it hold at most {}", p,
               tensor_count, c.left(), c.left() / 32);

    kvs_.reserve(static_cast<std::size_t>(kv_count));
    for (std::uint64_t i = 0; i < kv_count; ++i) {
      const std::size_t at = c.pos();
      const std::string_view key = c.string([&] { return fmt::format("metadata key {}", i); });
      KVD_EXPECT(!key.empty() && key.size() <= kMaxKeyBytes, "{}: metadata key {} at byte {} is {} bytes long, expected 1..{}", p,
                 i, at, key.size(), kMaxKeyBytes);
      const auto describe = [&] { return fmt::format("the value of metadata key {} '{}'", i, gguf_printable(key)); };
      const std::size_t type_at = c.pos();
      const auto type = c.read<std::uint32_t>([&] { return describe() + "'s type"; });
      KVD_EXPECT(gguf_value_type_name(type) != nullptr, "{}: metadata key '{}' at byte {}: unknown value type {} (expected 0..12)",
                 p, gguf_printable(key), type_at, type);
      GgufValue v = GgufValue::parse(c, static_cast<GgufValueType>(type), 0, describe);
      const auto [it, inserted] = kv_index_.emplace(std::string(key), kvs_.size());
      KVD_EXPECT(inserted, "{}: metadata key '{}' appears twice (keys {} and {})", p, gguf_printable(key), it->second, i);
      kvs_.push_back({std::string(key), v, at});
    }

    if (const GgufValue* a = find("general.alignment")) {
      KVD_EXPECT(a->is_integer(), "{}: metadata 'general.alignment' is {}, expected an integer (uint32)", p, a->type_name());
      const std::int64_t al = a->type == GgufValueType::uint64 && a->as_uint() > (std::uint64_t{1} << 31) ? -1 : a->as_int();
      KVD_EXPECT(al > 0 && al <= (std::int64_t{1} << 31) && std::has_single_bit(static_cast<std::uint64_t>(al)),
                 "{}: general.alignment is {}, expected a power of two in 1..2^31", p, a->to_string());
      alignment_ = static_cast<std::uint64_t>(al);
    }

    tensors_.reserve(static_cast<std::size_t>(tensor_count));
    for (std::uint64_t i = 0; i < tensor_count; ++i) {
      const std::size_t at = c.pos();
      const std::string_view name = c.string([&] { return fmt::format("the name of tensor {}", i); });
      KVD_EXPECT(!name.empty() && name.size() <= kMaxKeyBytes, "{}: tensor {} at byte {}: its name is {} bytes long, expected 1..{}",
                 p, i, at, name.size(), kMaxKeyBytes);
      const std::string pname = gguf_printable(name);
      const auto describe = [&](const char* what) {
        return [&, what] { return fmt::format("{} of tensor {} '{}'", what, i, pname); };
      };
      GgufTensor t;
      t.name = std::string(name);
      const auto n_dims = c.read<std::uint32_t>(describe("the dimension count"));
      KVD_EXPECT(n_dims >= 1 && n_dims <= 4, "{}: tensor '{}' has {} dimensions, expected 1..4", p, pname, n_dims);
      t.elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const auto ne = c.read<std::uint64_t>(describe("a dimension"));
        KVD_EXPECT(ne >= 1 && ne <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                   "{}: tensor '{}' dimension {} is {}, expected 1..2^63-1", p, pname, d, ne);
        t.dims.push_back(static_cast<std::int64_t>(ne));
        KVD_EXPECT(!__builtin_mul_overflow(t.elements, static_cast<std::int64_t>(ne), &t.elements),
                   "{}: tensor '{}': the element count of shape {} overflows 64 bits", p, pname, dims_string(t.dims, n_dims));
      }
      const auto type = c.read<std::uint32_t>(describe("the type"));
      const GgmlTypeTraits tr = ggml_type_traits(type);
      KVD_EXPECT(tr.name != nullptr, "{}: tensor '{}' has unknown GGML type id {}", p, pname, type);
      t.type = static_cast<GgmlType>(type);
      KVD_EXPECT(t.dims[0] % tr.block_elems == 0,
                 "{}: tensor '{}' of type {}: its first dimension {} is not a multiple of the {}-element block", p, pname, tr.name,
                 t.dims[0], tr.block_elems);
      std::int64_t bytes = 0;
      KVD_EXPECT(!__builtin_mul_overflow(t.elements / tr.block_elems, tr.block_bytes, &bytes) &&
                     static_cast<std::uint64_t>(bytes) <= std::numeric_limits<std::size_t>::max(),
                 "{}: tensor '{}': {} {} elements take more than 2^63 bytes", p, pname, t.elements, tr.name);
      t.bytes = static_cast<std::size_t>(bytes);
      t.offset = c.read<std::uint64_t>(describe("the offset"));
      KVD_EXPECT(t.offset % alignment_ == 0, "{}: tensor '{}' has offset {}, not a multiple of the alignment {}", p, pname, t.offset,
                 alignment_);
      const auto [it, inserted] = tensor_index_.emplace(t.name, tensors_.size());
      KVD_EXPECT(inserted, "{}: tensor name '{}' appears twice (tensors {} and {})", p, pname, it->second, i);
      tensors_.push_back(std::move(t));
    }

    // The data: aligned after the tensor infos; every tensor inside the file and apart.
    const std::uint64_t end = c.pos();
    const std::uint64_t pad = (alignment_ - end % alignment_) % alignment_;
    data_offset_ = end + pad;  // end < 2^63 and pad < 2^31: no overflow
    if (tensors_.empty()) return;
    KVD_EXPECT(data_offset_ <= size, "{}: the tensor data would start at byte {} (after the tensor infos, aligned to {}), past the end of the {}-byte file",
               p, data_offset_, alignment_, size);
    const std::uint64_t data_size = size - data_offset_;
    for (GgufTensor& t : tensors_) {
      KVD_EXPECT(t.offset <= data_size && t.bytes <= data_size - t.offset,
                 "{}: tensor '{}' ({} {} bytes at data offset {}) runs past the end of the file: the data section has {} bytes", p,
                 gguf_printable(t.name), ggml_type_name(t.type), t.bytes, t.offset, data_size);
      t.data = base + data_offset_ + t.offset;
    }
    std::vector<const GgufTensor*> order;
    order.reserve(tensors_.size());
    for (const GgufTensor& t : tensors_) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < order.size(); ++i)
      KVD_EXPECT(order[i - 1]->offset + order[i - 1]->bytes <= order[i]->offset,
                 "{}: tensors '{}' (bytes [{}, {})) and '{}' (from byte {}) overlap in the data section", p,
                 gguf_printable(order[i - 1]->name), order[i - 1]->offset, order[i - 1]->offset + order[i - 1]->bytes,
                 gguf_printable(order[i]->name), order[i]->offset);
  }

  // The dims read so far, and the count still to come, for an overflow message.
  static std::string dims_string(const std::vector<std::int64_t>& dims, std::uint32_t n_dims) {
    std::string s = fmt::format("[{}", fmt::join(dims, ", "));
    if (dims.size() < n_dims) s += ", ...";
    return s + "]";
  }

  std::shared_ptr<MappedFile> file_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = kDefaultAlignment;
  std::uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::map<std::string, std::size_t, std::less<>> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace kvdrive::llama
