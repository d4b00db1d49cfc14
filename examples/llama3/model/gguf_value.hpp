// GGUF metadata values: the value types with the ids files store, and GgufValue, a view of one
// value in the mapped file (a scalar, a string or an array, arrays possibly nested), read and
// validated at the cursor (gguf_cursor.hpp) and decoded on demand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "model/gguf_cursor.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

/// GGUF metadata value types, with the ids files store.
enum class GgufValueType : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

/// The name of a value type id ("uint32", "bool", "string", "array", ...), nullptr if unknown.
constexpr const char* gguf_value_type_name(std::uint32_t id) {
  constexpr const char* names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                   "bool",  "string", "array",  "uint64", "int64",  "float64"};
  return id < 13 ? names[id] : nullptr;
}
constexpr const char* gguf_value_type_name(GgufValueType t) { return gguf_value_type_name(static_cast<std::uint32_t>(t)); }

/// Bytes of a scalar of type t; 0 for string and array.
constexpr std::size_t gguf_scalar_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::uint8:
    case GgufValueType::int8:
    case GgufValueType::boolean: return 1;
    case GgufValueType::uint16:
    case GgufValueType::int16: return 2;
    case GgufValueType::uint32:
    case GgufValueType::int32:
    case GgufValueType::float32: return 4;
    case GgufValueType::uint64:
    case GgufValueType::int64:
    case GgufValueType::float64: return 8;
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

/// Fewest bytes an element of type t can take (for bounding counts before walking them).
constexpr std::size_t min_encoded_bytes(GgufValueType t) {
  if (t == GgufValueType::string) return 8;  // the length
  if (t == GgufValueType::array) return 12;  // element type + count
  return gguf_scalar_bytes(t);
}

}  // namespace gguf_detail

/// Nested arrays deeper than this are refused (each level would recurse).
inline constexpr int kGgufMaxArrayDepth = 16;

/// A metadata value: a view into the mapped file (valid while the GgufFile's map lives). Values
/// come from GgufFile, which validated them; the accessors throw kvdrive::Error on a wrong type.
struct GgufValue {
  GgufValueType type = GgufValueType::uint8;
  GgufValueType element_type = GgufValueType::uint8;  ///< arrays only
  const std::byte* data = nullptr;                    ///< scalar: its bytes; string: its bytes (after the length); array: its first element
  std::uint64_t length = 1;                           ///< string: bytes; array: elements; scalar: 1
  std::size_t bytes = 0;                              ///< bytes spanned from `data` (an array: all of its elements)

  bool is_integer() const {
    switch (type) {
      case GgufValueType::uint8:
      case GgufValueType::int8:
      case GgufValueType::uint16:
      case GgufValueType::int16:
      case GgufValueType::uint32:
      case GgufValueType::int32:
      case GgufValueType::uint64:
      case GgufValueType::int64: return true;
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
        KVD_EXPECT(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), "GGUF value {} is past the int64 range", u);
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
    KVD_EXPECT(gguf_value_type_name(et) != nullptr, "{}: {} at byte {}: unknown array element type {} (expected 0..12)", c.path(), describe(), at,
               et);
    v.element_type = static_cast<GgufValueType>(et);
    const auto n = c.read<std::uint64_t>([&] { return describe() + "'s element count"; });
    const std::size_t min = gguf_detail::min_encoded_bytes(v.element_type);
    KVD_EXPECT(n <= c.left() / min, "{}: {} at byte {}: an array of {} {} elements needs at least {} bytes per element, but only {} bytes remain",
               c.path(), describe(), at, n, gguf_value_type_name(et), min, c.left());
    if (v.element_type == GgufValueType::array)
      KVD_EXPECT(depth + 1 < kGgufMaxArrayDepth, "{}: {} at byte {}: arrays nested more than {} deep", c.path(), describe(), at, kGgufMaxArrayDepth);
    v.length = n;
    v.data = c.here();
    const std::size_t first = c.pos();
    if (gguf_scalar_bytes(v.element_type) != 0 && v.element_type != GgufValueType::boolean) {
      c.skip(n * min, describe);  // n * min <= left: no overflow
    } else {
      for (std::uint64_t i = 0; i < n; ++i) parse(c, v.element_type, depth + 1, [&] { return fmt::format("element {} of {}", i, describe()); });
    }
    v.bytes = c.pos() - first;
    return v;
  }
};

}  // namespace kvdrive::llama
