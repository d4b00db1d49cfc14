// AnyIndex: an index policy and one stream's state behind a virtual interface, so that a tool
// can compare a list of policies chosen at run time (eval::evaluate_stream, kvd-eval,
// bench_index). make_any_index wraps any index::IndexPolicy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvdrive/index/concept.hpp"

namespace kvdrive::eval {

/// A type-erased index policy with the state of one stream.
class AnyIndex {
 public:
  virtual ~AnyIndex() = default;
  virtual std::string name() const = 0;
  virtual void reset() = 0;                    ///< a fresh state for the next stream
  virtual void check(int head_dim) const = 0;  ///< throws if the policy does not fit head_dim
  virtual void build(const index::PageKeys& k) = 0;
  virtual void append(const index::PageKeys& k) = 0;
  virtual void select(const index::IndexQuery& q, std::vector<std::uint32_t>& out) const = 0;
  virtual std::size_t bytes() const = 0;
  virtual std::unique_ptr<AnyIndex> clone() const = 0;  ///< same policy, fresh state
  virtual bool ignores_budget() const = 0;              ///< Dense: every candidate
};

template <index::IndexPolicy I>
class IndexAdapter final : public AnyIndex {
 public:
  explicit IndexAdapter(I policy = {}, std::string label = {}) : policy_(std::move(policy)), label_(std::move(label)) {}
  std::string name() const override { return label_.empty() ? std::string(I::name()) : label_; }
  void reset() override { state_ = typename I::State{}; }
  void check(int head_dim) const override { index::check_for_head_dim(policy_, head_dim); }
  void build(const index::PageKeys& k) override { policy_.build(state_, k); }
  void append(const index::PageKeys& k) override { policy_.append(state_, k); }
  void select(const index::IndexQuery& q, std::vector<std::uint32_t>& out) const override { policy_.select(state_, q, out); }
  std::size_t bytes() const override { return policy_.bytes(state_); }
  std::unique_ptr<AnyIndex> clone() const override { return std::make_unique<IndexAdapter>(policy_, label_); }
  bool ignores_budget() const override {
    if constexpr (requires { I::kIgnoresBudget; }) return I::kIgnoresBudget;
    return false;
  }
  const I& policy() const { return policy_; }
  const typename I::State& state() const { return state_; }

 private:
  I policy_;
  std::string label_;
  typename I::State state_{};
};

template <index::IndexPolicy I>
std::unique_ptr<AnyIndex> make_any_index(I policy = {}, std::string label = {}) {
  return std::make_unique<IndexAdapter<I>>(std::move(policy), std::move(label));
}

}  // namespace kvdrive::eval
