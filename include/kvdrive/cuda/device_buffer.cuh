// DeviceBuffer<T>: an owning, movable array in device memory, with host<->device copies.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "kvdrive/cuda/check.cuh"

namespace kvdrive::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : size_(n) {
    if (n) KVD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }

  void upload(std::span<const T> host, cudaStream_t stream = nullptr) {
    KVD_EXPECT(host.size() <= size_, "DeviceBuffer::upload: {} elements into a buffer of {}", host.size(), size_);
    KVD_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream));
    KVD_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<T> download(cudaStream_t stream = nullptr) const {
    std::vector<T> host(size_);
    KVD_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, bytes(), cudaMemcpyDeviceToHost, stream));
    KVD_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvdrive::cuda
