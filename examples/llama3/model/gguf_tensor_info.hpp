// The tensor table of a GGUF file (gguf.hpp): each tensor's info (name, dimensions, GGML type,
// offset), read and checked at the cursor, and the tensors placed in the data section, each inside
// the file and apart from the others.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/ggml_type.hpp"
#include "model/gguf_cursor.hpp"
#include "model/gguf_value.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<std::int64_t> dims;  ///< ne0 first, as GGUF stores them: [cols, rows] for a matrix
  std::int64_t elements = 0;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;         ///< relative to the start of the tensor data
  const std::byte* data = nullptr;  ///< in the mapped file

  std::int64_t cols() const { return dims.empty() ? 0 : dims[0]; }
  /// The product of the dims after the first (1 for a vector).
  std::int64_t rows() const { return cols() > 0 ? elements / cols() : 0; }
  /// "[576, 49152]" (ne0 first).
  std::string shape() const { return fmt::format("[{}]", fmt::join(dims, ", ")); }
};

namespace gguf_detail {

// The dims read so far, and the count still to come, for an overflow message.
inline std::string dims_string(const std::vector<std::int64_t>& dims, std::uint32_t n_dims) {
  std::string s = fmt::format("[{}", fmt::join(dims, ", "));
  if (dims.size() < n_dims) s += ", ...";
  return s + "]";
}

/// Reads (and validates) the info of tensor i at the cursor: its name (1..max_name_bytes bytes),
/// 1 to 4 dimensions, a known GGML type whose blocks the first dimension fills, a byte size that
/// fits, an offset that is a multiple of the alignment. data is left null.
inline GgufTensor read_tensor_info(Cursor& c, std::uint64_t i, std::uint64_t alignment, std::uint64_t max_name_bytes) {
  const std::string& p = c.path();
  const std::size_t at = c.pos();
  const std::string_view name = c.string([&] { return fmt::format("the name of tensor {}", i); });
  KVD_EXPECT(!name.empty() && name.size() <= max_name_bytes, "{}: tensor {} at byte {}: its name is {} bytes long, expected 1..{}", p, i, at,
             name.size(), max_name_bytes);
  const std::string pname = gguf_printable(name);
  const auto describe = [&](const char* what) { return [&, what] { return fmt::format("{} of tensor {} '{}'", what, i, pname); }; };
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
  KVD_EXPECT(t.dims[0] % tr.block_elems == 0, "{}: tensor '{}' of type {}: its first dimension {} is not a multiple of the {}-element block", p,
             pname, tr.name, t.dims[0], tr.block_elems);
  std::int64_t bytes = 0;
  KVD_EXPECT(!__builtin_mul_overflow(t.elements / tr.block_elems, tr.block_bytes, &bytes) &&
                 static_cast<std::uint64_t>(bytes) <= std::numeric_limits<std::size_t>::max(),
             "{}: tensor '{}': {} {} elements take more than 2^63 bytes", p, pname, t.elements, tr.name);
  t.bytes = static_cast<std::size_t>(bytes);
  t.offset = c.read<std::uint64_t>(describe("the offset"));
  KVD_EXPECT(t.offset % alignment == 0, "{}: tensor '{}' has offset {}, not a multiple of the alignment {}", p, pname, t.offset, alignment);
  return t;
}

/// Points each tensor at its data, which starts at byte data_offset of the file [base, base +
/// size): every tensor inside the file and apart from the others.
inline void place_tensors(std::vector<GgufTensor>& tensors, const std::byte* base, std::size_t size, std::uint64_t data_offset,
                          std::uint64_t alignment, const std::string& p) {
  KVD_EXPECT(data_offset <= size,
             "{}: the tensor data would start at byte {} (after the tensor infos, aligned to {}), past the end of the {}-byte file", p, data_offset,
             alignment, size);
  const std::uint64_t data_size = size - data_offset;
  for (GgufTensor& t : tensors) {
    KVD_EXPECT(t.offset <= data_size && t.bytes <= data_size - t.offset,
               "{}: tensor '{}' ({} {} bytes at data offset {}) runs past the end of the file: the data section has {} bytes", p,
               gguf_printable(t.name), ggml_type_name(t.type), t.bytes, t.offset, data_size);
    t.data = base + data_offset + t.offset;
  }
  std::vector<const GgufTensor*> order;
  order.reserve(tensors.size());
  for (const GgufTensor& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < order.size(); ++i)
    KVD_EXPECT(order[i - 1]->offset + order[i - 1]->bytes <= order[i]->offset,
               "{}: tensors '{}' (bytes [{}, {})) and '{}' (from byte {}) overlap in the data section", p, gguf_printable(order[i - 1]->name),
               order[i - 1]->offset, order[i - 1]->offset + order[i - 1]->bytes, gguf_printable(order[i]->name), order[i]->offset);
}

}  // namespace gguf_detail

}  // namespace kvdrive::llama
