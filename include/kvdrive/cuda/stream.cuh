// Stream and Event: owning wrappers of cudaStream_t and cudaEvent_t, for the CUDA backend's
// compute and copy streams and the events that join them.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "kvdrive/cuda/check.cuh"

namespace kvdrive::cuda {

class Stream {
 public:
  Stream() { KVD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(stream_, o.stream_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_) cudaStreamDestroy(stream_);
  }

  cudaStream_t get() const { return stream_; }
  operator cudaStream_t() const { return stream_; }
  void synchronize() const { KVD_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { KVD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }

  void record(cudaStream_t s) { KVD_CUDA_CHECK(cudaEventRecord(event_, s)); }
  /// Makes `s` wait for the work recorded before this event.
  void wait_on(cudaStream_t s) const { KVD_CUDA_CHECK(cudaStreamWaitEvent(s, event_, 0)); }
  void synchronize() const { KVD_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace kvdrive::cuda
