// The KV element type (DType) and the one place where it turns into a compile-time type.
// Keys and values are stored in the KV dtype; queries, outputs and accumulation are float.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"

namespace kvdrive {

enum class DType { f32, f16, bf16 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

template <class T>
inline constexpr DType dtype_of = std::is_same_v<T, float>  ? DType::f32
                                  : std::is_same_v<T, half> ? DType::f16
                                                            : DType::bf16;

template <class T>
struct TypeTag {
  using type = T;
};

/// Calls f(TypeTag<T>{}) with T the element type of `t`. All dtype dispatch goes through here.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(TypeTag<float>{});
    case DType::f16: return f(TypeTag<half>{});
    case DType::bf16: return f(TypeTag<bfloat16>{});
  }
  fail("unknown dtype value {}", static_cast<int>(t));
}

}  // namespace kvdrive
