// Backend: where KvManager runs a step's work. Every backend offers host threads for the
// per-stream stages (select, classify; parallel_for). A backend whose fast tier is device
// memory (backend::Cuda with cuda::DeviceTier) also attends: the host cannot read the pages,
// so KvManager hands it the step's page lists as one PagedDecode and it runs the split-KV
// attention of Decision 2 there (attention::kSplitPages pages per split, merged in list order).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "kvdrive/core/dtype.hpp"

namespace kvdrive::backend {

/// One attention call over many streams' pages, described on the host. Pages are given by the
/// address of their K block in the fast tier's memory; V follows at +block_bytes.
struct PagedDecode {
  DType dtype = DType::f16;
  int group = 1, head_dim = 0;
  int page_tokens = 0;          ///< rows of a full page (no page has more)
  std::size_t block_bytes = 0;  ///< bytes of one page's K block
  float scale = 1.0f;
  std::size_t streams = 0;
  const float* q = nullptr;                 ///< [streams][group][head_dim]
  std::span<const std::uint32_t> offsets;   ///< [streams + 1]: stream s owns pages [offsets[s], offsets[s+1])
  std::span<const std::byte* const> pages;  ///< [pages]: each page's K block, in list order per stream
  std::span<const std::int32_t> tokens;     ///< [pages]: filled rows of each page
  float* out = nullptr;                     ///< [streams][group][head_dim]
  float* lse = nullptr;                     ///< [streams][group]
  float* page_lse = nullptr;                ///< [pages][group]
};

template <class B>
concept Backend = requires(B& b, std::size_t n, const std::function<void(std::size_t)>& fn) {
  b.parallel_for(n, fn);
};

/// A backend that attends pages in its own memory: attend() fills out, lse and page_lse of a
/// PagedDecode (on the host) and returns once they are there; it throws kvdrive::Error on failure.
template <class B>
concept DeviceBackend = Backend<B> && requires(B& b, const PagedDecode& d) {
  b.attend(d);
};

}  // namespace kvdrive::backend
