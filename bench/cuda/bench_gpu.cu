// bench_gpu: the CUDA kernels against the device's own limits, measured in the same run
// (cudaEvent timings, medians of --repeats launches), written as one JSON file:
//   copy         a uint4 copy kernel: the device's copy bandwidth (bytes read + written / s)
//   attention    sparse decode attention over a Llama-3-8B-shaped layer (8 KV heads, group 4,
//                head_dim 128, f16, 16-token pages) at a 6.25% budget of 128K tokens, batch 8:
//                K and V bytes attended per second, and that over the copy bandwidth (goal 0.7);
//                every stream reads its own pages, and the L2 is flushed before each timed run
//   gather       4 KiB blocks from pinned, mapped host memory into scattered device slots, by
//                the gather kernel and by one cudaMemcpyAsync per page, against one contiguous
//                cudaMemcpyAsync of the same bytes (goal 0.8)
//   decode       one layer step at 32K and 128K, batch 1: dense attention over every token,
//                sparse over the selected pages (all resident), and tiered (the keys and values
//                of 20% of the selected pages gathered from host first), in ms
//   pipeline     KvManager on the GPU (cuda::DeviceTier cache + SsdTier, backend::Cuda): one
//                layer of 8 KV heads of the synthetic trace `default` at 32K, batch 1 and 4,
//                Hierarchical at 6.25% selected on the GPU (DeviceHierarchical), Lookahead W=3,
//                warm-up; Elastic's step time against
//                Serial's, medians of the decode steps (host wall clock)
//
//   bench_gpu [--json FILE] [--repeats N] [--quick]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <chrono>
#include <filesystem>

#include "kvdrive/core/half.hpp"
#include "kvdrive/cuda/backend.cuh"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_hierarchical.cuh"
#include "kvdrive/cuda/device_tier.cuh"
#include "kvdrive/eval/layer_inputs.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "kvdrive/cuda/dense_decode.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/page_gather.cuh"
#include "kvdrive/cuda/sparse_decode.cuh"
#include "kvdrive/cuda/stream.cuh"
#include "kernel_setups.cuh"

namespace kc = kvdrive::cuda;
using kvdrive::half;
using kvdrive::bench_gpu::GatherSetup;
using kvdrive::bench_gpu::SparseSetup;

namespace {

int g_repeats = 5;
void* g_flush = nullptr;  // twice the L2: written before every timed run, so no run starts L2-hot
std::size_t g_flush_bytes = 0;

__global__ void CopyKernel(const uint4* src, uint4* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

/// Median milliseconds of `g_repeats` timed runs of f (after one untimed run).
template <class F>
double time_ms(cudaStream_t s, F&& f) {
  cudaEvent_t a, b;
  KVD_CUDA_CHECK(cudaEventCreate(&a));
  KVD_CUDA_CHECK(cudaEventCreate(&b));
  f();
  KVD_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> ms;
  for (int r = 0; r < g_repeats; ++r) {
    if (g_flush) KVD_CUDA_CHECK(cudaMemsetAsync(g_flush, r, g_flush_bytes, s));
    KVD_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    KVD_CUDA_CHECK(cudaEventRecord(b, s));
    KVD_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    KVD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double copy_bandwidth(cudaStream_t s, std::size_t bytes) {
  kc::DeviceBuffer<uint4> a(bytes / 16), b(bytes / 16);
  KVD_CUDA_CHECK(cudaMemset(a.data(), 1, a.bytes()));
  const double ms = time_ms(s, [&] {
    CopyKernel<<<1024, 256, 0, s>>>(a.data(), b.data(), a.size());
    KVD_CUDA_CHECK(cudaGetLastError());
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

// The kernels' workload: a Llama-3-8B-shaped layer (8 KV heads, group 4, head_dim 128, f16,
// 16-token pages), batch 8, at a 6.25% budget.
constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128, kPageTokens = 16, kBatch = 8;
constexpr double kBudget = 0.0625;

/// Pages selected at kBudget of `pages` candidates, plus a sink page and the local window's.
std::int64_t selected_pages(std::int64_t pages) {
  return static_cast<std::int64_t>(std::ceil(kBudget * static_cast<double>(pages))) + 1 + 64 / kPageTokens;
}

struct DecodeRow {
  std::int64_t context;
  double dense_ms, sparse_ms, tiered_ms;
  double dense_split_ms;  ///< every page through the split-KV kernel, as index::Dense runs in KvManager
};

/// Everything but the KvManager part, in the JSON's order.
struct KernelFigures {
  double copy_bps = 0, att_bps = 0, att_one_bps = 0;
  std::size_t page_bytes = 0;
  int gather_pages = 0;
  double g_kernel = 0, g_memcpy = 0, g_contig = 0;
  std::vector<DecodeRow> decode;
};

struct PipelineRow {
  std::int64_t context = 0;
  int batch = 0;
  std::size_t micro_batch = 0;
  double serial_ms = 0, elastic_ms = 0, hit_rate = 0;
  kvdrive::StageTimes serial_stages;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using Gpu = kvdrive::Tiers<kc::DeviceTier, kvdrive::tier::SsdTier>;
using GpuSerial = kvdrive::KvManager<kc::DeviceHierarchical, kvdrive::eviction::Lookahead, Gpu, kvdrive::pipeline::Serial, kvdrive::backend::Cuda>;
using GpuElastic = kvdrive::KvManager<kc::DeviceHierarchical, kvdrive::eviction::Lookahead, Gpu, kvdrive::pipeline::Elastic, kvdrive::backend::Cuda>;

/// Serial and Elastic KvManagers on the GPU, each holding the batch's sequences.
struct GpuPair {
  GpuSerial serial;
  GpuElastic elastic;
  std::vector<kvdrive::SeqId> ids_s, ids_e;
};

/// The batch's sequences (the trace `default`, seed 1, 2, ...; one layer) prefilled into both
/// managers and warmed up; returns their decode steps (the prompt is in the managers now).
std::vector<kvdrive::eval::LayerInputs> load_batch(GpuPair& m, std::int64_t context, int batch, int steps) {
  using namespace kvdrive;
  const eval::SyntheticPreset preset = eval::synthetic_preset("default");
  std::vector<eval::LayerInputs> inputs;
  for (int b = 0; b < batch; ++b) {
    const eval::SyntheticTrace trace(preset, static_cast<std::uint64_t>(b + 1), context, steps);
    eval::LayerInputs& in = inputs.emplace_back(eval::layer_inputs(trace, 0, preset.shape.kv_heads));
    auto load = [&](auto& kv, std::vector<SeqId>& ids) {
      ids.push_back(kv.add_sequence());
      kv.prefill(ids.back(), 0, in.prompt_k(), in.prompt_v());
      kv.warm_up(ids.back(), 0, in.observation_queries());
    };
    load(m.serial, m.ids_s);
    load(m.elastic, m.ids_e);
    in.k = {};
    in.v = {};
  }
  return inputs;
}

/// Elastic tuned on the first step, then both managers through every step, in turns: the row's
/// step times (medians), micro-batch, hit rate and Serial's stage times.
void time_pipelines(GpuPair& m, const std::vector<kvdrive::eval::LayerInputs>& inputs, const kvdrive::ModelShape& shape, int batch, int steps,
                    PipelineRow& row) {
  using namespace kvdrive;
  const int qh = shape.q_heads, kvh = shape.kv_heads, d = shape.head_dim;
  std::vector<float> q(static_cast<std::size_t>(batch) * qh * d), k(static_cast<std::size_t>(batch) * kvh * d), v(k.size()), out(q.size());
  auto fill = [&](int s) { eval::batch_step(inputs, s, q, k, v); };
  fill(0);
  m.elastic.tune(0, m.ids_e, make_view(q, batch, qh, d), make_view(k, batch, kvh, d), make_view(v, batch, kvh, d), make_view(out, batch, qh, d));
  row.micro_batch = m.elastic.pipeline_policy().micro_batch_for(static_cast<std::size_t>(batch * kvh));
  std::vector<double> ts, te;
  for (int s = 0; s < steps; ++s) {
    fill(s);
    auto timed = [&](auto& kv, const std::vector<SeqId>& ids) {
      const auto t0 = std::chrono::steady_clock::now();
      kv.attend(0, ids, make_view(q, batch, qh, d), make_view(k, batch, kvh, d), make_view(v, batch, kvh, d), make_view(out, batch, qh, d));
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    ts.push_back(timed(m.serial, m.ids_s));
    te.push_back(timed(m.elastic, m.ids_e));
    row.serial_stages += m.serial.last_stats().time;
  }
  row.serial_ms = median(ts);
  row.elastic_ms = median(te);
  row.hit_rate = m.serial.total_stats().hit_rate();
}

/// Serial and Elastic KvManagers on the GPU decoding the same steps, in turns.
PipelineRow pipeline_case(std::int64_t context, int batch, int steps) {
  using namespace kvdrive;
  const eval::SyntheticPreset preset = eval::synthetic_preset("default");
  const int kvh = preset.shape.kv_heads, d = preset.shape.head_dim, qh = preset.shape.q_heads;
  Config c;
  c.shape = {1, qh, kvh, d};
  c.budget = Budget::fraction(0.0625);
  const auto dir = std::filesystem::temp_directory_path();
  auto store = [&](const char* name) {
    tier::SsdTier::Params p;
    p.path = (dir / (std::string("kvd_bench_gpu_") + name + ".store")).string();
    tier::SsdTier::remove_files(p.path);
    return p;
  };
  const tier::SsdTier::Params sp = store("serial"), ep = store("elastic");
  PipelineRow row{context, batch};
  {
    GpuPair m{GpuSerial(c, {}, eviction::Lookahead{3}, Gpu(kc::DeviceTier{}, tier::SsdTier(sp))),
              GpuElastic(c, {}, eviction::Lookahead{3}, Gpu(kc::DeviceTier{}, tier::SsdTier(ep)), pipeline::Elastic{}),
              {},
              {}};
    const std::vector<eval::LayerInputs> inputs = load_batch(m, context, batch, steps);
    time_pipelines(m, inputs, c.shape, batch, steps, row);
  }
  tier::SsdTier::remove_files(sp.path);
  tier::SsdTier::remove_files(ep.path);
  return row;
}

/// Attention: batch 8 x 8 KV heads at 128K tokens, 6.25% of the pages (plus sink and local).
void attention_report(cudaStream_t stream, std::mt19937& rng, KernelFigures& f) {
  const std::int64_t ctx = 131072, pages_ctx = ctx / kPageTokens;
  const auto sel_pages = selected_pages(pages_ctx);
  SparseSetup att(kBatch * kKvHeads, kGroup, kHeadDim, kPageTokens, sel_pages, rng);
  att.stage_pages = 1;  // the first kernel's way, side by side with the split staged together
  const double ms_one = time_ms(stream, [&] { att.launch(stream); });
  att.stage_pages = 0;
  const double ms = time_ms(stream, [&] { att.launch(stream); });
  f.att_bps = static_cast<double>(att.attended_bytes) / (ms * 1e-3);
  f.att_one_bps = static_cast<double>(att.attended_bytes) / (ms_one * 1e-3);
  std::printf(
      "sparse attention: %lld pages x %d streams, %.3f ms, %.1f GB/s of K+V = %.2f of copy bandwidth (goal 0.7); "
      "pages staged one at a time: %.3f ms, %.2f of copy (staged together: %.2fx faster)\n",
      static_cast<long long>(sel_pages), kBatch * kKvHeads, ms, f.att_bps / 1e9, f.att_bps / f.copy_bps, ms_one, f.att_one_bps / f.copy_bps,
      ms_one / ms);
}

/// Gather: 4 KiB blocks (the keys or the values of a 16-token page of head_dim 128, f16).
void gather_report(cudaStream_t stream, std::mt19937& rng, KernelFigures& f) {
  GatherSetup g(f.page_bytes, f.gather_pages, rng);
  const double bytes = static_cast<double>(f.gather_pages) * static_cast<double>(f.page_bytes);
  f.g_kernel = bytes / (time_ms(stream, [&] { g.kernel(stream); }) * 1e-3);
  f.g_memcpy = bytes / (time_ms(stream, [&] { g.memcpys(stream); }) * 1e-3);
  f.g_contig = bytes / (time_ms(stream, [&] { g.contiguous(stream); }) * 1e-3);
  std::printf("gather %d pages of %zu B: kernel %.1f GB/s, per-page memcpy %.1f GB/s, contiguous memcpy %.1f GB/s; best/contiguous %.2f (goal 0.8)\n",
              f.gather_pages, f.page_bytes, f.g_kernel / 1e9, f.g_memcpy / 1e9, f.g_contig / 1e9, std::max(f.g_kernel, f.g_memcpy) / f.g_contig);
}

/// DenseDecodeKernel over every token of `context`, one layer, batch 1: ms per launch.
double dense_decode_ms(cudaStream_t stream, std::int64_t context) {
  const int kvh = kKvHeads, d = kHeadDim;
  kc::DeviceBuffer<half> k(static_cast<std::size_t>(kvh) * context * d), v(k.size());
  KVD_CUDA_CHECK(cudaMemset(k.data(), 0x22, k.bytes()));
  KVD_CUDA_CHECK(cudaMemset(v.data(), 0x11, v.bytes()));
  std::vector<float> hq(static_cast<std::size_t>(kvh) * kGroup * d, 0.01f);
  kc::DeviceBuffer<float> q{std::span<const float>(hq)}, out(hq.size());
  std::vector<int> tok(static_cast<std::size_t>(kvh), static_cast<int>(context));
  kc::DeviceBuffer<int> dt{std::span<const int>(tok)};
  kc::DenseDecodeParams<half> p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.tokens = dt.data();
  p.kv_stride = context * d;
  p.out = out.data();
  p.streams = kvh;
  p.group = kGroup;
  p.head_dim = d;
  p.page_tokens = kPageTokens;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  return time_ms(stream, [&] { KVD_CUDA_CHECK(kc::dense_decode(p, stream)); });
}

/// Decode step of one layer, batch 1: dense vs sparse vs tiered.
DecodeRow decode_row(cudaStream_t stream, std::mt19937& rng, std::int64_t context, std::size_t page_bytes) {
  const std::int64_t pages = context / kPageTokens;
  DecodeRow row{context, 0, 0, 0, 0};
  row.dense_ms = dense_decode_ms(stream, context);
  {
    SparseSetup all(kKvHeads, kGroup, kHeadDim, kPageTokens, pages, rng);
    row.dense_split_ms = time_ms(stream, [&] { all.launch(stream); });
  }
  const auto sel = selected_pages(pages);
  SparseSetup sp(kKvHeads, kGroup, kHeadDim, kPageTokens, sel, rng);
  row.sparse_ms = time_ms(stream, [&] { sp.launch(stream); });
  // 20% of the selected pages missed: their keys and values, 2 blocks of page_bytes each.
  GatherSetup g(page_bytes, static_cast<int>(std::max<std::int64_t>(1, 2 * (kKvHeads * sel / 5))), rng);
  row.tiered_ms = time_ms(stream, [&] {
    g.kernel(stream);
    sp.launch(stream);
  });
  std::printf(
      "decode step (one layer, batch 1) at %lld tokens: dense %.3f ms (DenseDecodeKernel; every page by the split-KV "
      "kernel %.3f ms), sparse %.3f ms, tiered %.3f ms; dense (split-KV) / sparse %.1fx\n",
      static_cast<long long>(context), row.dense_ms, row.dense_split_ms, row.sparse_ms, row.tiered_ms, row.dense_split_ms / row.sparse_ms);
  return row;
}

/// The JSON file: the kernel figures, the KvManager rows so far, and whether they are all there.
void write_json(const std::string& json, const cudaDeviceProp& prop, const KernelFigures& k, const std::vector<PipelineRow>& pipeline_rows,
                bool pipeline_done) {
  FILE* f = std::fopen(json.c_str(), "w");
  KVD_EXPECT(f != nullptr, "bench_gpu: cannot write {}", json);
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"sm\": %d%d,\n  \"repeats\": %d,\n", prop.name, prop.major, prop.minor, g_repeats);
  std::fprintf(f, "  \"copy_bytes_per_s\": %.6g,\n", k.copy_bps);
  std::fprintf(f, "  \"attention\": {\"bytes_per_s\": %.6g, \"vs_copy\": %.4f, \"goal\": 0.7, \"page_by_page_bytes_per_s\": %.6g},\n", k.att_bps,
               k.att_bps / k.copy_bps, k.att_one_bps);
  std::fprintf(f,
               "  \"gather\": {\"page_bytes\": %zu, \"pages\": %d, \"kernel_bytes_per_s\": %.6g, \"memcpy_bytes_per_s\": %.6g, "
               "\"contiguous_bytes_per_s\": %.6g, \"best_vs_contiguous\": %.4f, \"goal\": 0.8},\n",
               k.page_bytes, k.gather_pages, k.g_kernel, k.g_memcpy, k.g_contig, std::max(k.g_kernel, k.g_memcpy) / k.g_contig);
  std::fprintf(f, "  \"decode\": [");
  for (std::size_t i = 0; i < k.decode.size(); ++i)
    std::fprintf(f, "%s\n    {\"context\": %lld, \"dense_ms\": %.4f, \"dense_split_ms\": %.4f, \"sparse_ms\": %.4f, \"tiered_ms\": %.4f}",
                 i ? "," : "", static_cast<long long>(k.decode[i].context), k.decode[i].dense_ms, k.decode[i].dense_split_ms, k.decode[i].sparse_ms,
                 k.decode[i].tiered_ms);
  std::fprintf(f, "\n  ],\n  \"pipeline\": [");
  for (std::size_t i = 0; i < pipeline_rows.size(); ++i) {
    const PipelineRow& r = pipeline_rows[i];
    std::fprintf(f,
                 "%s\n    {\"context\": %lld, \"batch\": %d, \"micro_batch\": %zu, \"serial_ms\": %.4f, \"elastic_ms\": %.4f, "
                 "\"serial_over_elastic\": %.4f, \"hit_rate\": %.4f}",
                 i ? "," : "", static_cast<long long>(r.context), r.batch, r.micro_batch, r.serial_ms, r.elastic_ms, r.serial_ms / r.elastic_ms,
                 r.hit_rate);
  }
  std::fprintf(f, "\n  ],\n  \"pipeline_complete\": %s\n}\n", pipeline_done ? "true" : "false");
  std::fclose(f);
}

/// KvManager on the GPU: Elastic against Serial. The JSON is written before the KvManager part
/// and again after each row, so a run cut short still leaves the kernel figures.
void pipeline_report(const std::string& json, const cudaDeviceProp& prop, const KernelFigures& k, bool quick) {
  std::vector<PipelineRow> pipeline_rows;
  write_json(json, prop, k, pipeline_rows, false);
  const int pipeline_steps = quick ? 8 : 16;
  for (int batch : {1, 4}) {
    const PipelineRow r = pipeline_case(32768, batch, pipeline_steps);
    const double n = pipeline_steps;
    std::printf(
        "KvManager step (one layer, 8 KV heads, 32K, batch %d, micro-batch %zu): serial %.3f ms, elastic %.3f ms, serial/elastic %.2f; "
        "hit rate %.1f%%; serial stages (mean ms) select %.3f classify %.3f fetch %.3f compute %.3f commit %.3f\n",
        batch, r.micro_batch, r.serial_ms, r.elastic_ms, r.serial_ms / r.elastic_ms, 100 * r.hit_rate, r.serial_stages.select_ms / n,
        r.serial_stages.classify_ms / n, r.serial_stages.fetch_ms / n, r.serial_stages.compute_ms / n, r.serial_stages.commit_ms / n);
    std::fflush(stdout);
    pipeline_rows.push_back(r);
    write_json(json, prop, k, pipeline_rows, false);
  }
  write_json(json, prop, k, pipeline_rows, true);
}

/// Reads the command line; false, said on stderr, at an unknown option.
bool parse_options(int argc, char** argv, std::string& json, bool& quick) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json = argv[++i];
    else if (a == "--repeats" && i + 1 < argc) g_repeats = std::max(1, std::atoi(argv[++i]));
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "bench_gpu: unknown option %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json = "bench_gpu.json";
  bool quick = false;
  if (!parse_options(argc, argv, json, quick)) return 2;
  if (kc::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    KVD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    kc::Stream stream;
    std::mt19937 rng(1);
    g_flush_bytes = 2 * static_cast<std::size_t>(std::max(prop.l2CacheSize, 1 << 20));
    KVD_CUDA_CHECK(cudaMalloc(&g_flush, g_flush_bytes));
    KernelFigures k;
    k.copy_bps = copy_bandwidth(stream, quick ? (256u << 20) : (1u << 30));
    std::printf("copy kernel: %.1f GB/s (read + write)\n", k.copy_bps / 1e9);
    attention_report(stream, rng, k);
    k.page_bytes = static_cast<std::size_t>(kPageTokens) * kHeadDim * sizeof(half);
    k.gather_pages = quick ? 2048 : 8192;
    gather_report(stream, rng, k);
    for (std::int64_t context : {std::int64_t{32768}, std::int64_t{131072}}) k.decode.push_back(decode_row(stream, rng, context, k.page_bytes));
    pipeline_report(json, prop, k, quick);
    std::printf("wrote %s\n", json.c_str());
    cudaFree(g_flush);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
