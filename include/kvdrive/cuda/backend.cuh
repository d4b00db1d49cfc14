// backend::Cuda, first part: the device and the streams the CUDA backend will run its stages on
// (compute for selection and attention, copy for fetches). The kernels of each stage and the
// device tier come with the CUDA backend issue; today this holds the basics they share.
#pragma once

#include <optional>
#include <string_view>

#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/stream.cuh"

namespace kvdrive::backend {

class Cuda {
 public:
  struct Params {
    int device = 0;
  };

  Cuda() : Cuda(Params{}) {}
  explicit Cuda(Params p) : device_(p.device) {
    const int n = cuda::device_count();
    KVD_EXPECT(n > 0, "backend::Cuda: no CUDA device is available");
    KVD_EXPECT(device_ >= 0 && device_ < n, "backend::Cuda: device {} out of range [0, {})", device_, n);
    KVD_CUDA_CHECK(cudaSetDevice(device_));
    compute_.emplace();
    copy_.emplace();
  }

  static constexpr std::string_view name() { return "cuda"; }
  int device() const { return device_; }
  cudaStream_t compute_stream() const { return compute_->get(); }
  cudaStream_t copy_stream() const { return copy_->get(); }

 private:
  int device_ = 0;
  std::optional<cuda::Stream> compute_, copy_;  // created once the device is set
};

}  // namespace kvdrive::backend
