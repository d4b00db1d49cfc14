// The tensor types of GGML/GGUF files: their numeric ids (as GGUF stores them), names, and block
// layout (elements per block, bytes per block). Every id GGUF defines is listed, so that a file is
// validated (byte sizes, offsets) even where the decoder cannot compute with its type;
// `computable` says which types the block kernels of quant.hpp implement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeTraits {
  const char* name = nullptr;    ///< nullptr: not a type id GGUF defines
  std::int64_t block_elems = 0;  ///< elements per block (1 for plain types)
  std::int64_t block_bytes = 0;  ///< bytes per block
  bool computable = false;       ///< quant.hpp decodes it and computes dot products with it
};

/// The traits of a type id as stored in a file (any 32-bit value; unknown ones have name nullptr).
constexpr GgmlTypeTraits ggml_type_traits(std::uint32_t id) {
  switch (id) {
    case 0: return {"F32", 1, 4, true};
    case 1: return {"F16", 1, 2, true};
    case 2: return {"Q4_0", 32, 18, true};
    case 3: return {"Q4_1", 32, 20, true};
    case 6: return {"Q5_0", 32, 22, true};
    case 7: return {"Q5_1", 32, 24, true};
    case 8: return {"Q8_0", 32, 34, true};
    case 9: return {"Q8_1", 32, 40, false};
    case 10: return {"Q2_K", 256, 84, false};
    case 11: return {"Q3_K", 256, 110, false};
    case 12: return {"Q4_K", 256, 144, true};
    case 13: return {"Q5_K", 256, 176, true};
    case 14: return {"Q6_K", 256, 210, true};
    case 15: return {"Q8_K", 256, 292, false};
    case 16: return {"IQ2_XXS", 256, 66, false};
    case 17: return {"IQ2_XS", 256, 74, false};
    case 18: return {"IQ3_XXS", 256, 98, false};
    case 19: return {"IQ1_S", 256, 50, false};
    case 20: return {"IQ4_NL", 32, 18, false};
    case 21: return {"IQ3_S", 256, 110, false};
    case 22: return {"IQ2_S", 256, 82, false};
    case 23: return {"IQ4_XS", 256, 136, false};
    case 24: return {"I8", 1, 1, false};
    case 25: return {"I16", 1, 2, false};
    case 26: return {"I32", 1, 4, false};
    case 27: return {"I64", 1, 8, false};
    case 28: return {"F64", 1, 8, false};
    case 29: return {"IQ1_M", 256, 56, false};
    case 30: return {"BF16", 1, 2, true};
    case 34: return {"TQ1_0", 256, 54, false};
    case 35: return {"TQ2_0", 256, 66, false};
    case 39: return {"MXFP4", 32, 17, false};
    default: return {};
  }
}

constexpr GgmlTypeTraits ggml_type_traits(GgmlType t) { return ggml_type_traits(static_cast<std::uint32_t>(t)); }

inline std::string ggml_type_name(GgmlType t) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  return tr.name ? tr.name : "type " + std::to_string(static_cast<std::uint32_t>(t));
}

/// Bytes of one row of `cols` elements (cols must be a multiple of the block size).
inline std::size_t ggml_row_bytes(GgmlType t, std::int64_t cols) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  KVD_EXPECT(tr.name != nullptr, "unknown GGML type {}", static_cast<std::uint32_t>(t));
  KVD_EXPECT(cols >= 0 && cols % tr.block_elems == 0, "a row of {} {} elements is not a whole number of {}-element blocks", cols, tr.name,
             tr.block_elems);
  return static_cast<std::size_t>(cols / tr.block_elems * tr.block_bytes);
}

}  // namespace kvdrive::llama
