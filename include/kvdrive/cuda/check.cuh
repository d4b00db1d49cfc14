// Error handling for the CUDA backend. Launchers return cudaError_t (KVD_CUDA_TRY propagates
// one); host code that owns resources turns a failure into kvdrive::Error (KVD_CUDA_CHECK),
// naming the call, the file and line, and CUDA's own message.
#pragma once

#include <cstdio>

#include <cuda_runtime.h>

#include "kvdrive/core/error.hpp"

/// Returns the cudaError_t of `call` from the enclosing function if it is not cudaSuccess.
#define KVD_CUDA_TRY(call)                              \
  do {                                                  \
    const cudaError_t kvd_status_ = (call);             \
    if (kvd_status_ != cudaSuccess) return kvd_status_; \
  } while (0)

/// Throws kvdrive::Error if `call` does not return cudaSuccess.
#define KVD_CUDA_CHECK(call)                                                                                                \
  do {                                                                                                                      \
    const cudaError_t kvd_status_ = (call);                                                                                 \
    if (kvd_status_ != cudaSuccess)                                                                                         \
      ::kvdrive::fail("CUDA error at {}:{}: {} returned {} ({})", __FILE__, __LINE__, #call, cudaGetErrorName(kvd_status_), \
                      cudaGetErrorString(kvd_status_));                                                                     \
  } while (0)

namespace kvdrive::cuda {

/// Number of usable CUDA devices; 0 when there is no driver or no device (and then, with
/// `why`, what CUDA said, e.g. a driver older than the runtime, on stderr).
inline int device_count(bool why = true) {
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    if (why) std::fprintf(stderr, "CUDA: no usable device: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
    cudaGetLastError();  // clear the sticky error left by a missing driver
    return 0;
  }
  return n;
}

/// Makes `device` current for its scope and restores the caller's device after, so that the
/// library's calls leave an engine's threads on the device they were on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KVD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KVD_CUDA_CHECK(cudaSetDevice(device));
    switched_ = previous_ != device;
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace kvdrive::cuda
