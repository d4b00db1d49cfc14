// backend::Cpu: host memory is the fast tier and attention runs on a thread pool, one stream per
// task, so results do not depend on the number of threads.
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
  explicit Cpu(Params p) : pool_(std::make_unique<ThreadPool>(p.threads)) {}

  static constexpr std::string_view name() { return "cpu"; }
  unsigned threads() const { return pool_->threads(); }

  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { pool_->parallel_for(n, fn); }

 private:
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace kvdrive::backend
