// View<T, Rank>: a non-owning pointer + extents + strides (in elements), row-major by default.
// It is how callers hand K, V, queries and outputs to kvdrive without copying, whatever their
// engine's layout. Indexing is KVD_HOST_DEVICE so kernels' params can embed views too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive {

template <class T, std::size_t Rank>
struct View {
  T* data = nullptr;
  std::int64_t extents[Rank] = {};
  std::int64_t strides[Rank] = {};

  KVD_HOST_DEVICE std::int64_t extent(std::size_t i) const { return extents[i]; }

  template <class... I>
  KVD_HOST_DEVICE T& operator()(I... idx) const {
    static_assert(sizeof...(I) == Rank, "View: wrong number of indices");
    const std::int64_t is[] = {static_cast<std::int64_t>(idx)...};
    std::int64_t offset = 0;
    for (std::size_t r = 0; r < Rank; ++r) offset += is[r] * strides[r];
    return data[offset];
  }

  /// Pointer to the innermost row at the given leading indices (requires unit inner stride).
  template <class... I>
  KVD_HOST_DEVICE T* row(I... idx) const {
    static_assert(sizeof...(I) == Rank - 1, "View::row: give all indices but the last");
    const std::int64_t is[] = {static_cast<std::int64_t>(idx)...};
    std::int64_t offset = 0;
    for (std::size_t r = 0; r + 1 < Rank; ++r) offset += is[r] * strides[r];
    return data + offset;
  }

  /// Read-only view of the same data (for views of non-const T; a template, so that a view of
  /// const T does not declare a conversion to its own type).
  template <class U = T>
  requires(!std::is_const_v<U>) operator View<const U, Rank>() const {
    View<const U, Rank> v;
    v.data = data;
    for (std::size_t r = 0; r < Rank; ++r) {
      v.extents[r] = extents[r];
      v.strides[r] = strides[r];
    }
    return v;
  }
};

/// A contiguous row-major view over `data` with the given extents.
template <class T, class... E>
View<T, sizeof...(E)> make_view(T* data, E... extents) {
  View<T, sizeof...(E)> v;
  v.data = data;
  const std::int64_t ex[] = {static_cast<std::int64_t>(extents)...};
  std::int64_t stride = 1;
  for (std::size_t r = sizeof...(E); r-- > 0;) {
    v.extents[r] = ex[r];
    v.strides[r] = stride;
    stride *= ex[r];
  }
  return v;
}

template <class T, class... E>
View<const T, sizeof...(E)> make_view(const std::vector<T>& data, E... extents) {
  return make_view(data.data(), extents...);
}

template <class T, class... E>
View<T, sizeof...(E)> make_view(std::vector<T>& data, E... extents) {
  return make_view(data.data(), extents...);
}

}  // namespace kvdrive
