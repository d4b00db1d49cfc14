// KVD_HOST_DEVICE: marks the per-element math that both the CPU loops and the CUDA kernels call.
// Under nvcc it expands to `__host__ __device__ inline`; under a plain C++ compiler to `inline`,
// so the same functions compile, run and are tested without the CUDA toolkit.
#pragma once

#if defined(__CUDACC__)
#define KVD_HOST_DEVICE __host__ __device__ inline
#else
#define KVD_HOST_DEVICE inline
#endif
