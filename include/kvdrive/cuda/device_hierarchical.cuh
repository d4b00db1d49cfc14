// cuda::DeviceHierarchical: KVDrive's hierarchical index with selection on the GPU. An index
// policy (index::IndexPolicy and index::BatchSelectIndex) that keeps index::Hierarchical's state
// on the host, where prefill builds it and decode appends to it, plus a copy in device memory
// (index::flatten, uploaded when the state has changed since the last upload: once per sealed
// page, into buffers kept and grown with headroom, so no cudaMalloc or cudaFree in the steady
// state). KvManager calls select_batch() once per micro-batch: one hierarchical_select launch
// (hierarchical.cuh) for all its streams, on the index's own stream. select() of one stream, and
// so cluster-size tuning and anything else that selects stream by stream, stays on the host.
//
// The GPU's selection may differ from the CPU's at near-ties (FMA contraction, summation order),
// so a KvManager with this index gives outputs close to, not bitwise equal to, one with
// index::Hierarchical; with either, Serial and Elastic give the same bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "kvdrive/core/dtype.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/hierarchical.cuh"
#include "kvdrive/cuda/stream.cuh"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/hierarchical.hpp"
#include "kvdrive/index/hierarchical_flat.hpp"

namespace kvdrive::cuda {

class DeviceHierarchical {
 public:
  using Params = index::HierarchicalParams;

  /// A stream's flat index in device memory, as of one version of the host state.
  struct Mirror {
    std::uint64_t version = ~std::uint64_t{0};
    std::int64_t clusters = 0, members = 0;
    int pair_count = 0;
    DeviceBuffer<std::byte> centroids, means, radii;
    DeviceBuffer<std::uint8_t> pairs;
    DeviceBuffer<float> radius;
    DeviceBuffer<std::int64_t> offsets;
    DeviceBuffer<std::uint32_t> pages, cluster;

    template <class T>
    HierarchicalDeviceIndex<T> view() const {
      return {reinterpret_cast<const T*>(centroids.data()), radius.data(),  offsets.data(), pages.data(),
              reinterpret_cast<const T*>(means.data()),     cluster.data(), clusters,       members,
              reinterpret_cast<const T*>(radii.data()),     pairs.data(),   pair_count};
    }
  };

  struct State {
    index::Hierarchical::State host;
    std::uint64_t version = 0;               ///< bumped by every build() and append()
    mutable std::shared_ptr<Mirror> device;  ///< uploaded by select_batch when stale

    State() = default;
    State(State&&) noexcept = default;
    State& operator=(State&&) noexcept = default;
    // A copy has its own device mirror (made on its first batch selection).
    State(const State& o) : host(o.host), version(o.version) {}
    State& operator=(const State& o) {
      host = o.host;
      version = o.version;
      device.reset();
      return *this;
    }
  };

  Params params;
  int device = 0;  ///< the GPU the mirrors live on (the KvManager's fast tier's)

  DeviceHierarchical() = default;
  explicit DeviceHierarchical(const Params& p, int gpu = 0) : params(p), device(gpu) {
    params.validate();
    KVD_EXPECT(params.pair_radii <= kHierarchicalMaxPairs, "DeviceHierarchical: pair_radii {} exceeds the GPU kernel's {}", params.pair_radii,
               kHierarchicalMaxPairs);
  }

  static constexpr std::string_view name() { return "hierarchical-gpu"; }

  static std::uint32_t cluster_of(const State& s, std::uint32_t p) { return index::Hierarchical::cluster_of(s.host, p); }

  void build(State& s, const index::PageKeys& k) const {
    host().build(s.host, k);
    ++s.version;
  }
  void append(State& s, const index::PageKeys& k) const {
    host().append(s.host, k);
    ++s.version;
  }
  std::size_t bytes(const State& s) const { return host().bytes(s.host); }
  void check(int head_dim) const { host().check(head_dim); }

  /// One stream, on the host (index::Hierarchical::select).
  void select(const State& s, const index::IndexQuery& q, std::vector<std::uint32_t>& out) const { host().select(s.host, q, out); }

  /// Many streams in one launch; outs[i] is replaced by stream i's pages, ascending.
  void select_batch(std::span<const State* const> states, std::span<const index::IndexQuery> queries,
                    std::span<std::vector<std::uint32_t>* const> outs) const {
    KVD_EXPECT(states.size() == queries.size() && outs.size() == states.size(), "DeviceHierarchical: {} states, {} queries, {} outputs",
               states.size(), queries.size(), outs.size());
    if (states.empty()) return;
    DType dtype = DType::f32;
    for (const State* s : states)
      if (s->host.pages > 0) dtype = s->host.dtype;
    for (std::size_t i = 0; i < states.size(); ++i) {
      const State& s = *states[i];
      KVD_EXPECT(s.host.dtype == dtype || s.host.pages == 0, "DeviceHierarchical: streams of different dtypes in one batch");
      KVD_EXPECT(s.host.pages == 0 || s.host.head_dim == queries[i].head_dim, "DeviceHierarchical: a query of head_dim {} for an index of {}",
                 queries[i].head_dim, s.host.head_dim);
    }
    std::lock_guard lock(shared_->mutex);  // one batch at a time uses the scratch and the mirrors
    const DeviceGuard on(device);
    if (!shared_->scratch) shared_->scratch = std::make_unique<Scratch>();  // on first use: no GPU needed before
    dispatch_dtype(dtype, [&](auto tag) { run<typename decltype(tag)::type>(states, queries, outs); });
  }

 private:
  struct Scratch {
    Stream stream;
    DeviceBuffer<std::byte> views;
    DeviceBuffer<float> q, est;
    DeviceBuffer<std::int64_t> first, end, budget;
    DeviceBuffer<unsigned> count;
    DeviceBuffer<std::uint32_t> bitmap, out;
    DeviceBuffer<int> out_count;
  };

  index::Hierarchical host() const {
    index::Hierarchical h;
    h.params = params;
    return h;
  }

  template <class B>
  static void ensure(B& b, std::size_t n) {
    if (b.size() < n) b = B(std::max(n, b.size() * 2));
  }

  /// Brings a stream's mirror up to its state's version: flattens the state and copies it into
  /// the mirror's buffers on `stream`, growing a buffer (by half again) only when it is too small.
  static void refresh(const State& s, cudaStream_t stream) {
    if (!s.device) s.device = std::make_shared<Mirror>();
    Mirror& m = *s.device;
    if (m.version == s.version) return;
    const index::HierarchicalFlat f = index::flatten(s.host);
    const auto put = [&](auto& buf, const auto& host) {
      using T = std::remove_cvref_t<decltype(*buf.data())>;
      if (buf.size() < host.size()) buf = std::remove_cvref_t<decltype(buf)>(host.size() + host.size() / 2);
      if (!host.empty()) KVD_CUDA_CHECK(cudaMemcpyAsync(buf.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
    };
    m.version = ~std::uint64_t{0};  // stale until the copies are queued
    put(m.centroids, f.centroids);
    put(m.means, f.member_means);
    put(m.radius, f.radius);
    put(m.offsets, f.member_offsets);
    put(m.pages, f.member_pages);
    put(m.cluster, f.member_cluster);
    put(m.radii, f.member_radii);
    put(m.pairs, f.pairs);
    KVD_CUDA_CHECK(cudaStreamSynchronize(stream));  // f's host arrays die here
    m.clusters = f.clusters();
    m.members = f.members();
    m.pair_count = static_cast<int>(f.pairs.size());
    m.version = s.version;
  }

  template <class T>
  void run(std::span<const State* const> all_states, std::span<const index::IndexQuery> all_queries,
           std::span<std::vector<std::uint32_t>* const> all_outs) const {
    // A budget that covers every candidate takes them all, as index::Hierarchical::select does,
    // without the GPU; the others go to the kernel.
    Batch<T> b;
    for (std::size_t i = 0; i < all_states.size(); ++i) {
      const index::IndexQuery& iq = all_queries[i];
      if (iq.budget_pages >= iq.candidates()) {
        all_outs[i]->clear();
        for (std::int64_t p = iq.first_candidate; p < iq.end_candidate; ++p) all_outs[i]->push_back(static_cast<std::uint32_t>(p));
        continue;
      }
      b.add(*this, *all_states[i], iq, all_outs[i]);
    }
    if (b.outs.empty()) return;
    Scratch& sc = *shared_->scratch;
    const cudaStream_t st = sc.stream.get();
    upload(b, sc);
    KVD_CUDA_CHECK(hierarchical_select(kernel_params(b, sc), st));
    const auto un = b.outs.size();
    std::vector<std::uint32_t> out(un * static_cast<std::size_t>(b.max_k));
    std::vector<int> count(un);
    KVD_CUDA_CHECK(cudaMemcpyAsync(out.data(), sc.out.data(), out.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, st));
    KVD_CUDA_CHECK(cudaMemcpyAsync(count.data(), sc.out_count.data(), un * sizeof(int), cudaMemcpyDeviceToHost, st));
    sc.stream.synchronize();
    for (std::size_t i = 0; i < un; ++i) {
      const auto* o = out.data() + i * static_cast<std::size_t>(b.max_k);
      b.outs[i]->assign(o, o + std::clamp(count[i], 0, static_cast<int>(b.max_k)));
    }
  }

  /// The streams of one launch, gathered on the host: each one's device view, query, candidate
  /// range and budget, and the largest scratch any of them needs.
  template <class T>
  struct Batch {
    std::vector<HierarchicalDeviceIndex<T>> views;
    std::vector<float> q;
    std::vector<std::int64_t> first, end, budget;
    std::vector<std::vector<std::uint32_t>*> outs;
    int group = 0, head_dim = 0;
    std::int64_t stride = 1, words = 1, max_k = 1;

    void add(const DeviceHierarchical& ix, const State& s, const index::IndexQuery& iq, std::vector<std::uint32_t>* out) {
      if (outs.empty()) group = iq.group, head_dim = iq.head_dim;
      KVD_EXPECT(iq.group == group && iq.head_dim == head_dim, "DeviceHierarchical: queries of different shapes in one batch");
      ix.refresh(s, ix.shared_->scratch->stream.get());
      views.push_back(s.device->template view<T>());
      q.insert(q.end(), iq.q, iq.q + static_cast<std::size_t>(group) * head_dim);
      first.push_back(iq.first_candidate);
      end.push_back(iq.end_candidate);
      budget.push_back(std::min(iq.budget_pages, iq.candidates()));
      outs.push_back(out);
      stride = std::max(stride, s.device->clusters + s.device->members);
      words = std::max(words, iq.end_candidate / 32 + 1);
      max_k = std::max(max_k, budget.back());
    }
  };

  /// Device scratch for the batch, and its inputs copied up.
  template <class T>
  void upload(const Batch<T>& b, Scratch& sc) const {
    const auto un = b.outs.size();
    ensure(sc.views, un * sizeof(HierarchicalDeviceIndex<T>));
    ensure(sc.q, b.q.size());
    ensure(sc.est, un * static_cast<std::size_t>(b.group) * static_cast<std::size_t>(b.stride));
    ensure(sc.first, un);
    ensure(sc.end, un);
    ensure(sc.budget, un);
    ensure(sc.count, un * static_cast<std::size_t>(b.stride));
    ensure(sc.bitmap, un * static_cast<std::size_t>(b.words));
    ensure(sc.out, un * static_cast<std::size_t>(b.max_k));
    ensure(sc.out_count, un);
    const cudaStream_t st = sc.stream.get();
    const auto h2d = [&](void* dst, const void* src, std::size_t bytes) {
      KVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
    };
    h2d(sc.views.data(), b.views.data(), un * sizeof(HierarchicalDeviceIndex<T>));
    h2d(sc.q.data(), b.q.data(), b.q.size() * sizeof(float));
    h2d(sc.first.data(), b.first.data(), un * sizeof(std::int64_t));
    h2d(sc.end.data(), b.end.data(), un * sizeof(std::int64_t));
    h2d(sc.budget.data(), b.budget.data(), un * sizeof(std::int64_t));
  }

  template <class T>
  HierarchicalSelectParams<T> kernel_params(const Batch<T>& b, Scratch& sc) const {
    HierarchicalSelectParams<T> p;
    p.index = reinterpret_cast<const HierarchicalDeviceIndex<T>*>(sc.views.data());
    p.q = sc.q.data();
    p.first_candidate = sc.first.data();
    p.end_candidate = sc.end.data();
    p.budget = sc.budget.data();
    p.radius_weight = params.radius_weight;
    p.expand = params.expand;
    p.min_scored = params.min_scored;
    p.score_all_below = params.score_all_below;
    p.pair_weight = params.pair_weight;
    p.rotary = params.rotary;
    p.scratch_est = sc.est.data();
    p.scratch_count = sc.count.data();
    p.scratch_bitmap = sc.bitmap.data();
    p.scratch_stride = b.stride;
    p.bitmap_words = b.words;
    p.out = sc.out.data();
    p.out_count = sc.out_count.data();
    p.streams = static_cast<int>(b.outs.size());
    p.group = b.group;
    p.head_dim = b.head_dim;
    p.max_k = static_cast<int>(b.max_k);
    return p;
  }

  struct Shared {
    std::mutex mutex;
    std::unique_ptr<Scratch> scratch;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();  // shared by copies, guarded by its mutex
};
static_assert(index::BatchSelectIndex<DeviceHierarchical>);

}  // namespace kvdrive::cuda
