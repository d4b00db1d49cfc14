// Composes a KvManager from the installed headers and checks one dense step: with all keys
// equal, attention is the mean of the values.
#include <kvdrive/kvdrive.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace kvdrive;
  Config cfg;
  cfg.shape = {1, 4, 2, 16};
  cfg.dtype = DType::f32;
  KvManager<index::Dense, eviction::Lru> kv(cfg);
  const SeqId id = kv.add_sequence();
  std::vector<float> k(10 * 2 * 16, 0.5f), v(10 * 2 * 16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i / 32);  // token index
  kv.prefill(id, 0, make_view(k, 10, 2, 16), make_view(v, 10, 2, 16));
  std::vector<float> q(4 * 16, 1.0f), nk(2 * 16, 0.5f), nv(2 * 16, 10.0f), out(4 * 16);
  const SeqId batch[] = {id};
  kv.attend(0, batch, make_view(q, 1, 4, 16), make_view(nk, 1, 2, 16), make_view(nv, 1, 2, 16), make_view(out, 1, 4, 16));
  const float expect = 55.0f / 11.0f;  // mean of 0..10
  if (std::fabs(out[0] - expect) > 1e-5f) {
    std::printf("consumer: got %f, expected %f\n", out[0], expect);
    return 1;
  }
  std::printf("consumer: find_package(kvdrive) works; dense step ok\n");
  return 0;
}
