// kvd-llama --device cuda: run() (run.hpp) with the KV cache in GPU memory. Compiled by nvcc
// into the module kvd-llama-cuda.so, which kvd-llama loads for --device cuda (run_cuda.hpp).
// Selection runs on the GPU (cuda::DeviceHierarchical, one launch per micro-batch), pages move
// through cuda::DeviceTier, attention runs in backend::Cuda's kernels and the projections in
// cuBLAS.
#include <algorithm>
#include <cstring>
#include <string_view>

#include "kernels/cublas_linear.hpp"
#include "kvdrive/cuda/backend.cuh"
#include "kvdrive/cuda/device_hierarchical.cuh"
#include "kvdrive/cuda/device_tier.cuh"
#include "app/run_cuda.hpp"

namespace kvdrive::llama {
namespace {

int run_on_gpu(const RunOptions& o, const Model& model, ThreadPool& pool) {
  KVD_EXPECT(o.attention.index == "hierarchical" || o.attention.index == "dense" || o.attention.mode == "dense",
             "--device cuda runs --index hierarchical (or dense); '{}' runs on the CPU", o.attention.index);
  KVD_EXPECT(o.attention.rescore_pool <= 0, "--device cuda selects with the device's Hierarchical, without token-level rescoring: --rescore-pool 0");
  KVD_EXPECT(o.tiers.host_bytes == 0, "--device cuda: --host-bytes (a DRAM tier between GPU memory and the SSD) is not supported yet");
  using Device = Tiers<cuda::DeviceTier>;
  using DeviceSsd = Tiers<cuda::DeviceTier, tier::SsdTier>;
  const auto gpu = [&] { return backend::Cuda({0, o.model.threads}); };
  if (o.attention.mode == "tiered") {
    KVD_EXPECT(o.attention.index == "hierarchical", "--mode tiered is sparse: choose --index hierarchical");
    if (o.tiers.pipeline == "elastic")
      return run<cuda::DeviceHierarchical, DeviceSsd, pipeline::Elastic, backend::Cuda, CublasLinear>(o, model, pool, gpu());
    return run<cuda::DeviceHierarchical, DeviceSsd, pipeline::Serial, backend::Cuda, CublasLinear>(o, model, pool, gpu());
  }
  if (o.attention.mode == "dense" || o.attention.index == "dense")
    return run<index::Dense, Device, pipeline::Serial, backend::Cuda, CublasLinear>(o, model, pool, gpu());
  return run<cuda::DeviceHierarchical, Device, pipeline::Serial, backend::Cuda, CublasLinear>(o, model, pool, gpu());
}

void copy_error(std::string_view what, char* error, std::size_t error_size) {
  const std::size_t n = std::min(what.size(), error_size - 1);
  std::memcpy(error, what.data(), n);
  error[n] = '\0';
}

}  // namespace
}  // namespace kvdrive::llama

/// The module's entry point (CudaModuleEntry in run_cuda.hpp).
extern "C" __attribute__((visibility("default"))) int kvd_llama_run_on_cuda(const kvdrive::llama::RunOptions* options,
                                                                            const kvdrive::llama::Model* model, kvdrive::ThreadPool* pool,
                                                                            const kvdrive::llama::CudaModuleAbi* abi, char* error,
                                                                            std::size_t error_size) noexcept {
  using namespace kvdrive::llama;
  try {
    if (!(*abi == CudaModuleAbi{})) {
      copy_error("--device cuda: kvd-llama-cuda.so was built from other sources than kvd-llama; build both again", error, error_size);
      return 1;
    }
    return run_on_gpu(*options, *model, *pool);
  } catch (const std::exception& e) {  // kvdrive::Error, or out of memory
    copy_error(e.what(), error, error_size);
    return 1;
  }
}
