// kvd-llama --device cuda: the run on a GPU (run_cuda.cu, built when CUDA is found). Without
// CUDA, run_on_cuda says so.
#pragma once

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "model/model.hpp"
#include "app/run.hpp"

namespace kvdrive::llama {

#if KVD_LLAMA_CUDA
/// run() with the KV cache in GPU memory (cuda::DeviceTier, behind it the SSD in tiered mode),
/// attention by backend::Cuda and the projections by CublasLinear. Checks the options it supports.
int run_on_cuda(const RunOptions& o, const Model& model, ThreadPool& pool);
#else
inline int run_on_cuda(const RunOptions&, const Model&, ThreadPool&) {
  fail("--device cuda: this kvd-llama was built without CUDA (no nvcc was found when it was configured)");
}
#endif

}  // namespace kvdrive::llama
