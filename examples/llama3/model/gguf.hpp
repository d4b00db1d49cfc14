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
//
// The parts: gguf_cursor.hpp (bounded reads), gguf_value.hpp (metadata values),
// gguf_tensor_info.hpp (the tensor table and its placement in the data section); this file reads
// the header and the metadata, and answers for the whole file.
#pragma once

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
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "model/ggml_type.hpp"
#include "model/gguf_cursor.hpp"
#include "model/gguf_tensor_info.hpp"
#include "model/gguf_value.hpp"
#include "kvdrive/core/error.hpp"
#include "model/mapped_file.hpp"

namespace kvdrive::llama {

struct GgufKv {
  std::string key;
  GgufValue value;
  std::size_t offset = 0;  ///< file offset of the key
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
      KVD_EXPECT(v->as_int() >= 0, "{}: metadata '{}' is {}, expected a non-negative integer", path(), gguf_printable(key), v->as_int());
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
    if (v != nullptr) KVD_EXPECT((v->*is)(), "{}: metadata '{}' is {}, expected {}", path(), gguf_printable(key), v->type_name(), expected);
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
    gguf_detail::Cursor c(file_->data(), file_->size(), 0, p);
    const auto [tensor_count, kv_count] = parse_header(c);
    parse_metadata(c, kv_count);
    read_alignment();
    tensors_.reserve(static_cast<std::size_t>(tensor_count));
    for (std::uint64_t i = 0; i < tensor_count; ++i) {
      GgufTensor t = gguf_detail::read_tensor_info(c, i, alignment_, kMaxKeyBytes);
      const auto [it, inserted] = tensor_index_.emplace(t.name, tensors_.size());
      KVD_EXPECT(inserted, "{}: tensor name '{}' appears twice (tensors {} and {})", p, gguf_printable(t.name), it->second, i);
      tensors_.push_back(std::move(t));
    }

    // The data: aligned after the tensor infos; every tensor inside the file and apart.
    const std::uint64_t end = c.pos();
    const std::uint64_t pad = (alignment_ - end % alignment_) % alignment_;
    data_offset_ = end + pad;  // end < 2^63 and pad < 2^31: no overflow
    if (tensors_.empty()) return;
    gguf_detail::place_tensors(tensors_, file_->data(), file_->size(), data_offset_, alignment_, p);
  }

  /// The header: the magic, the version (2 or 3, little-endian), and the tensor and metadata key
  /// counts, each bounded by the bytes after the header. Returns {tensor count, key count}.
  std::pair<std::uint64_t, std::uint64_t> parse_header(gguf_detail::Cursor& c) {
    const std::string& p = c.path();
    const std::byte* base = file_->data();
    const std::size_t size = file_->size();
    KVD_EXPECT(size >= 4, "{}: {} bytes: too short for a GGUF file (no 4-byte magic \"GGUF\")", p, size);
    if (std::memcmp(base, "GGUF", 4) != 0) {
      const auto* b = reinterpret_cast<const unsigned char*>(base);
      fail("{}: not a GGUF file: the magic bytes are {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 (\"GGUF\")", p, b[0], b[1], b[2], b[3]);
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
    KVD_EXPECT(kv_count <= c.left() / 13, "{}: the header claims {} metadata keys, but the {} bytes after it hold at most {}", p, kv_count, c.left(),
               c.left() / 13);
    KVD_EXPECT(tensor_count <= c.left() / 32, "{}: the header claims {} tensors, but the {} bytes after it hold at most {}", p, tensor_count,
               c.left(), c.left() / 32);
    return {tensor_count, kv_count};
  }

  /// The metadata key/values, each validated, no key twice.
  void parse_metadata(gguf_detail::Cursor& c, std::uint64_t kv_count) {
    const std::string& p = c.path();
    kvs_.reserve(static_cast<std::size_t>(kv_count));
    for (std::uint64_t i = 0; i < kv_count; ++i) {
      const std::size_t at = c.pos();
      const std::string_view key = c.string([&] { return fmt::format("metadata key {}", i); });
      KVD_EXPECT(!key.empty() && key.size() <= kMaxKeyBytes, "{}: metadata key {} at byte {} is {} bytes long, expected 1..{}", p, i, at, key.size(),
                 kMaxKeyBytes);
      const auto describe = [&] { return fmt::format("the value of metadata key {} '{}'", i, gguf_printable(key)); };
      const std::size_t type_at = c.pos();
      const auto type = c.read<std::uint32_t>([&] { return describe() + "'s type"; });
      KVD_EXPECT(gguf_value_type_name(type) != nullptr, "{}: metadata key '{}' at byte {}: unknown value type {} (expected 0..12)", p,
                 gguf_printable(key), type_at, type);
      GgufValue v = GgufValue::parse(c, static_cast<GgufValueType>(type), 0, describe);
      const auto [it, inserted] = kv_index_.emplace(std::string(key), kvs_.size());
      KVD_EXPECT(inserted, "{}: metadata key '{}' appears twice (keys {} and {})", p, gguf_printable(key), it->second, i);
      kvs_.push_back({std::string(key), v, at});
    }
  }

  /// general.alignment, where given: a power of two in 1..2^31.
  void read_alignment() {
    const std::string& p = path();
    if (const GgufValue* a = find("general.alignment")) {
      KVD_EXPECT(a->is_integer(), "{}: metadata 'general.alignment' is {}, expected an integer (uint32)", p, a->type_name());
      const std::int64_t al = a->type == GgufValueType::uint64 && a->as_uint() > (std::uint64_t{1} << 31) ? -1 : a->as_int();
      KVD_EXPECT(al > 0 && al <= (std::int64_t{1} << 31) && std::has_single_bit(static_cast<std::uint64_t>(al)),
                 "{}: general.alignment is {}, expected a power of two in 1..2^31", p, a->to_string());
      alignment_ = static_cast<std::uint64_t>(al);
    }
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
