// kvd-llama --device cuda: the run on a GPU. Its code (run_cuda.cu, nvcc) is built into a module,
// kvd-llama-cuda.so beside the program, that kvd-llama loads only when --device cuda asks for
// it: a CPU run then maps neither the CUDA runtime nor cuBLAS, whose loading alone costs
// kvd-llama over 200 MiB of resident memory, and runs where no CUDA library is installed.
// Without CUDA at build time, run_on_cuda says so.
#pragma once

#include <cstddef>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "model/model.hpp"
#include "app/run.hpp"

#if KVD_LLAMA_CUDA
#include <dlfcn.h>

#include <array>
#include <filesystem>
#include <string>
#endif

namespace kvdrive::llama {

/// What the program and the module check they agree on before the module reads the program's
/// objects: a module left from other sources would otherwise read them with another layout.
struct CudaModuleAbi {
  std::size_t run_options = sizeof(RunOptions);
  std::size_t model = sizeof(Model);
  std::size_t thread_pool = sizeof(ThreadPool);
  bool operator==(const CudaModuleAbi&) const = default;
};

/// The module's entry point (extern "C", so dlsym finds it by this name). It runs run() on the GPU
/// and returns its exit code; an error comes back as text in `error` (the module may carry its
/// own copy of the C++ runtime, so no exception crosses from it), with the return value 1.
using CudaModuleEntry = int (*)(const RunOptions* options, const Model* model, ThreadPool* pool, const CudaModuleAbi* abi, char* error,
                                std::size_t error_size);
inline constexpr const char* kCudaModuleEntry = "kvd_llama_run_on_cuda";
inline constexpr const char* kCudaModuleFile = "kvd-llama-cuda.so";

#if KVD_LLAMA_CUDA
/// run() with the KV cache in GPU memory (cuda::DeviceTier, behind it the SSD in tiered mode),
/// attention by backend::Cuda and the projections by CublasLinear, from the module beside the
/// program. The module checks the options it supports.
inline int run_on_cuda(const RunOptions& o, const Model& model, ThreadPool& pool) {
  const std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe").parent_path() / kCudaModuleFile;
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: CUDA's libraries stay until exit
  KVD_EXPECT(module != nullptr, "--device cuda: cannot load {} (built with kvd-llama, with cuBLAS on the library path): {}", path.string(),
             dlerror());
  const auto entry = reinterpret_cast<CudaModuleEntry>(dlsym(module, kCudaModuleEntry));
  KVD_EXPECT(entry != nullptr, "--device cuda: {} has no {}: {}", path.string(), kCudaModuleEntry, dlerror());
  const CudaModuleAbi abi;
  std::array<char, 4096> error{};
  const int rc = entry(&o, &model, &pool, &abi, error.data(), error.size());
  if (error[0] != '\0') throw Error(error.data());
  return rc;
}
#else
inline int run_on_cuda(const RunOptions&, const Model&, ThreadPool&) {
  fail("--device cuda: this kvd-llama was built without CUDA (no nvcc was found when it was configured)");
}
#endif

}  // namespace kvdrive::llama
