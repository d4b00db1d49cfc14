// backend::Cpu: host memory is the fast tier and attention runs on a thread pool, one stream per
// task, so results do not depend on the number of threads. The pool is the backend's own, or one
// it shares with the caller (a decoder's), so that one set of workers, spinning between jobs,
// serves the whole step instead of two sets taking turns on the same cores.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "kvdrive/core/thread_pool.hpp"

namespace kvdrive::backend {

class Cpu {
 public:
  struct Params {
    unsigned threads = 0;  ///< 0: all hardware threads
  };

  Cpu() : Cpu(Params{}) {}
  explicit Cpu(Params p) : owned_(std::make_unique<ThreadPool>(p.threads)), pool_(owned_.get()) {}
  /// Runs on `shared`, which must outlive the backend and take no other caller's parallel_for
  /// while the manager steps (ThreadPool is not reentrant).
  explicit Cpu(ThreadPool& shared) : pool_(&shared) {}

  static constexpr std::string_view name() { return "cpu"; }
  unsigned threads() const { return pool_->threads(); }

  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { pool_->parallel_for(n, fn); }

 private:
  std::unique_ptr<ThreadPool> owned_;
  ThreadPool* pool_;
};

}  // namespace kvdrive::backend
