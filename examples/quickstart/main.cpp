// The README's example: compose a KvManager from policies, prefill one layer, decode one step.
#include <kvdrive/kvdrive.hpp>

#include <cstdio>
#include <vector>

int main() {
  using namespace kvdrive;

  Config cfg;
  cfg.shape = {/*layers*/ 1, /*q_heads*/ 32, /*kv_heads*/ 8, /*head_dim*/ 128};
  cfg.dtype = DType::f16;                 // KV stored in fp16, math in fp32
  cfg.budget = Budget::fraction(0.0625);  // attend 6.25% of the pages (+ sink and local)

  // Index, eviction, tiers, pipeline: each a policy. Here KVDrive's hierarchical index selects the pages,
  // its lookahead cache keeps the critical pages of the last 3 steps, host DRAM is the only tier.
  // KVDrive's hierarchical index, its pool of 8 budgets rescored token by token (the default).
  using Index = index::TokenRescore<index::Hierarchical>;
  KvManager<Index, eviction::Lookahead, Tiers<tier::HostTier>, pipeline::Serial> kv(cfg, Index{}, eviction::Lookahead{.window = 3});

  const int prompt = 4096, d = 128;
  std::vector<float> k(prompt * 8 * d, 0.01f), v(prompt * 8 * d, 0.02f);
  const SeqId seq = kv.add_sequence();
  kv.prefill(seq, /*layer*/ 0, make_view(k, prompt, 8, d), make_view(v, prompt, 8, d));
  // Optional warm-up: the prompt's last queries place the pages they attend in the cache (a no-op
  // here: with host DRAM as the only tier every page is resident).
  std::vector<float> q_last(16 * 32 * d, 0.1f);
  kv.warm_up(seq, 0, make_view(q_last, 16, 32, d));

  // One decode step of layer 0: the new token's q, k, v in; attention output out.
  std::vector<float> q(32 * d, 0.1f), k1(8 * d, 0.01f), v1(8 * d, 0.02f), out(32 * d);
  const SeqId batch[] = {seq};
  kv.attend(0, batch, make_view(q, 1, 32, d), make_view(k1, 1, 8, d), make_view(v1, 1, 8, d), make_view(out, 1, 32, d));

  const Stats& s = kv.last_stats();
  std::printf("selected %llu of %llu candidate pages, attended %llu tokens, out[0] = %.4f\n", static_cast<unsigned long long>(s.selected),
              static_cast<unsigned long long>(s.candidates), static_cast<unsigned long long>(s.attended_tokens), out[0]);
  kv.release(seq);
}
