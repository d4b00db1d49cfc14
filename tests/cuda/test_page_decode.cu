// The GPU page decode (cuda/page_decode.cuh) against the CPU's (codec/cpu_codec.hpp): pages coded
// on the CPU, decoded by PageDecodeKernel into scattered slots, equal decode_page_portable bit
// for bit, for f32, f16 and bf16, INT8 and INT4, and coded pages at odd byte offsets. Exit 77 (skipped) without a GPU.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/codec/cpu_codec.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/page_decode.cuh"

using namespace kvdrive;

template <class T>
static int check(codec::PageCodec pc, int tokens, int head_dim, std::size_t offset, std::mt19937& rng) {
  const codec::CodedLayout l = codec::CodedLayout::make(tokens, head_dim, pc);
  const int pages = 19;
  const std::size_t elems = 2 * static_cast<std::size_t>(tokens) * head_dim;
  std::vector<std::uint8_t> coded(offset + pages * l.bytes);
  std::vector<T> expected(pages * elems);
  for (int p = 0; p < pages; ++p) {
    std::vector<T> page(elems);
    for (auto& x : page) x = from_float<T>((static_cast<float>(rng() % 20001) - 10000.0f) / (p % 3 == 0 ? 100.0f : 3000.0f));
    codec::encode_page(l, page.data(), coded.data() + offset + p * l.bytes);
    codec::decode_page_portable(l, coded.data() + offset + p * l.bytes, expected.data() + p * elems);
  }
  cuda::DeviceBuffer<std::uint8_t> d_coded{std::span<const std::uint8_t>(coded)};
  cuda::DeviceBuffer<T> d_pages(pages * elems);
  std::vector<const std::uint8_t*> src(pages);
  std::vector<T*> dst(pages);
  for (int p = 0; p < pages; ++p) {
    src[p] = d_coded.data() + offset + p * l.bytes;
    dst[p] = d_pages.data() + ((p * 7) % pages) * elems;  // scattered slots
  }
  cuda::DeviceBuffer<const std::uint8_t*> d_src{std::span<const std::uint8_t* const>(src)};
  cuda::DeviceBuffer<T*> d_dst{std::span<T* const>(dst)};
  KVD_CUDA_CHECK(cuda::decode_pages<T>({d_src.data(), d_dst.data(), l, pages}));
  KVD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = d_pages.download();
  int bad = 0;
  for (int p = 0; p < pages; ++p)
    if (std::memcmp(got.data() + ((p * 7) % pages) * elems, expected.data() + p * elems, elems * sizeof(T)) != 0) ++bad;
  std::printf("decode %s, %zu-byte values, %d x %d, offset %zu: %s\n", pc.name().c_str(), sizeof(T), tokens, head_dim, offset,
              bad ? "MISMATCH" : "ok");
  return bad;
}

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device; the page-decode kernel was compiled but not run\n");
    return 77;
  }
  std::mt19937 rng(11);
  int bad = 0;
  for (codec::Codec c : {codec::Codec::int8, codec::Codec::int4}) {
    bad += check<float>({c}, 8, 64, 0, rng);
    bad += check<half>({c}, 8, 64, 3, rng);
    bad += check<bfloat16>({c}, 16, 128, 1, rng);
    bad += check<half>({c}, 3, 10, 0, rng);
  }
  if (cuda::decode_pages<half>({nullptr, nullptr, codec::CodedLayout::make(8, 64, {codec::Codec::int4}), 2}) != cudaErrorInvalidValue) ++bad;
  std::printf("%s\n", bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
