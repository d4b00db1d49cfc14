// kvd-longbench's parts (bench/longbench): the RULER-style tasks fit their context and hold their
// answers where the depth says, the scoring, the intervals and KL against values worked by hand,
// the configuration syntax, and a truncated prefill snapshot against a prefill of fewer tokens.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "longbench/replay.hpp"
#include "longbench/stats.hpp"
#include "longbench/tasks.hpp"
#include "model/synthetic.hpp"

using namespace kvdrive;
using namespace kvdrive::longbench;

namespace {

/// A stand-in tokenizer: one token per whitespace-separated word.
std::int64_t words(const std::string& s) {
  std::istringstream in(s);
  std::string w;
  std::int64_t n = 0;
  while (in >> w) ++n;
  return n;
}

/// The chat frame adds 20 tokens around the user's turn and the reply prefix.
std::int64_t prompt_words(const std::string& user, const std::string& reply) { return 20 + words(user) + words(reply); }

}  // namespace

TEST_CASE("longbench tasks: every task fits its context and holds its answers; the needle sits at its depth") {
  for (TaskKind k : kAllTasks)
    for (Haystack h : {Haystack::prose, Haystack::repeat})
      for (std::int64_t ctx : {512, 2048})
        for (double depth : {0.0, 0.5, 1.0}) {
          const Task t = make_task({k, h, ctx, depth, 7}, prompt_words, words);
          INFO(task_name(k) << " " << haystack_name(h) << " " << ctx << " depth " << depth);
          const std::int64_t used = prompt_words(t.user, t.reply_prefix) + reply_tokens(k);
          CHECK(used <= ctx);
          CHECK(used >= ctx * 8 / 10);  // the document fills the context, not a fraction of it
          REQUIRE(!t.answers.empty());
          for (const auto& a : t.answers) CHECK(t.user.find(a) != std::string::npos);
          // The first planted sentence's place in the document follows the depth.
          const std::string first = k == TaskKind::vt ? "VAR " + t.answers[0] + " = " : "is: " + t.answers[0] + ".";
          const double at = static_cast<double>(t.user.find(first)) / static_cast<double>(t.user.size());
          CHECK(std::abs(at - depth) < 0.12);
        }
}

TEST_CASE("longbench documents: a unit too long for what is left is passed over where stopping would leave the document short") {
  std::string big = "x";
  for (int i = 1; i < 40; ++i) big += " x";  // 40 words
  const std::vector<std::string> units = {"a b c d e f g h i j", big, "k l m n o p q r s t", "u v w x y z a b c d", "e f g h i j k l m n"};
  // Budget 45: 10 words, then the 40-word unit does not fit (10 + 40 + 2 needle words > 45), and
  // stopping there would leave 12 tokens, under 80%: it is passed over and the 10-word units follow.
  const auto [doc, n] = longbench::detail::build_document(units, {{"NEEDLE here", 0.5}}, 45, words);
  CHECK(n == 42);
  CHECK(doc.find("x x") == std::string::npos);
  CHECK(doc.find("NEEDLE here") != std::string::npos);
  CHECK(doc.find("k l m") != std::string::npos);
  // Where stopping at the long unit already fills 80%, the document stops there, as before.
  const auto [doc2, n2] = longbench::detail::build_document({"a b c d e f g h i j", "k l m n o p q r s t", big}, {}, 24, words);
  CHECK(n2 == 20);
  CHECK(doc2.find("x x") == std::string::npos);
  // Every seed of a run gives each task its document.
  for (std::uint64_t seed = 0; seed < 200; ++seed)
    for (TaskKind k : kAllTasks) CHECK_NOTHROW(make_task({k, Haystack::prose, 1024, 0.5, seed * 7919}, prompt_words, words));
}

TEST_CASE("longbench tasks: multikey plants three distractors, multivalue four values, vt a chain in order") {
  const auto count = [](const std::string& s, const std::string& what) {
    std::size_t n = 0;
    for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  const Task mk = make_task({TaskKind::multikey, Haystack::prose, 2048, 0.3, 3}, prompt_words, words);
  CHECK(count(mk.user, "One of the special magic numbers for ") == 4);
  CHECK(mk.answers.size() == 1);
  const Task mv = make_task({TaskKind::multivalue, Haystack::prose, 2048, 0.3, 3}, prompt_words, words);
  CHECK(count(mv.user, "One of the special magic numbers for ") == 4);
  CHECK(mv.answers.size() == 4);
  const Task vt = make_task({TaskKind::vt, Haystack::prose, 2048, 0.2, 3}, prompt_words, words);
  REQUIRE(vt.answers.size() == 5);
  for (std::size_t i = 1; i < vt.answers.size(); ++i) {
    const auto assign = vt.user.find("VAR " + vt.answers[i] + " = VAR " + vt.answers[i - 1] + ".");
    REQUIRE(assign != std::string::npos);
    CHECK(assign > vt.user.find("VAR " + vt.answers[i - 1] + " = "));
  }
  // The same spec makes the same task; another seed another one.
  CHECK(make_task({TaskKind::vt, Haystack::prose, 2048, 0.2, 3}, prompt_words, words).user == vt.user);
  CHECK(make_task({TaskKind::vt, Haystack::prose, 2048, 0.2, 4}, prompt_words, words).user != vt.user);
}

TEST_CASE("longbench score: the fraction of answers the reply holds, as whole numbers and words") {
  Task t;
  t.answers = {"1234567", "7654321"};
  CHECK(score(t, " are 1234567 and 7654321.") == 1.0);
  CHECK(score(t, " are 1234567, 765432.") == 0.5);
  CHECK(score(t, " is 12345678") == 0.0);  // run into other digits
  t.answers = {"ABCDE"};
  CHECK(score(t, " VAR ABCDE,") == 1.0);
  CHECK(score(t, " VAR ABCDEF") == 0.0);
}

TEST_CASE("longbench statistics: Wilson and normal intervals and KL against values worked by hand") {
  std::vector<double> eight_of_ten(10, 1.0);
  eight_of_ten[0] = eight_of_ten[1] = 0.0;
  const Interval w = interval95(eight_of_ten);
  CHECK(w.mean == doctest::Approx(0.8));
  CHECK(w.low == doctest::Approx(0.4902).epsilon(1e-3));
  CHECK(w.high == doctest::Approx(0.9433).epsilon(1e-3));
  const Interval partial = interval95({0.5, 0.5, 1.0, 1.0});  // sd 0.2887, half 1.96 x 0.1443
  CHECK(partial.mean == doctest::Approx(0.75));
  CHECK(partial.low == doctest::Approx(0.75 - 0.2829).epsilon(1e-3));
  CHECK(partial.high == 1.0);  // clipped
  const std::vector<double> p = log_softmax({0.0f, 0.0f});
  const std::vector<double> q = {std::log(0.9), std::log(0.1)};
  CHECK(kl_divergence(p, q) == doctest::Approx(0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(5.0)));
  CHECK(kl_divergence(p, p) == 0.0);
}

TEST_CASE("longbench statistics: a paired difference and depth bands against values worked by hand") {
  // differences 0, 0, 0, -1, 0, -1, 0, 0: mean -0.25, sd 0.4629, half 1.96 x 0.4629 / sqrt(8) = 0.3208
  const std::vector<double> dense = {1, 1, 0, 1, 1, 1, 0, 1}, sparse = {1, 1, 0, 0, 1, 0, 0, 1};
  const Interval d = paired_difference95(sparse, dense);
  CHECK(d.n == 8);
  CHECK(d.mean == doctest::Approx(-0.25));
  CHECK(d.low == doctest::Approx(-0.25 - 0.3208).epsilon(1e-3));
  CHECK(d.high == doctest::Approx(-0.25 + 0.3208).epsilon(1e-3));
  const Interval same = paired_difference95(dense, dense);  // identical answers: no spread at all
  CHECK(same.mean == 0.0);
  CHECK(same.low == 0.0);
  CHECK(same.high == 0.0);
  CHECK(depth_band(0.0) == 0);
  CHECK(depth_band(0.33) == 0);
  CHECK(depth_band(0.34) == 1);
  CHECK(depth_band(0.67) == 2);
  CHECK(depth_band(1.0) == 2);
  CHECK(std::string(depth_band_name(1)) == "33-67%");
}

TEST_CASE("longbench configurations: names round-trip; bad ones are refused") {
  for (const char* s : {"dense", "quest@0.0625", "tiered:hierarchical@0.015625", "oracle-mass@1"}) CHECK(parse_config(s).name() == s);
  CHECK_THROWS_AS(parse_config("quest"), Error);
  CHECK_THROWS_AS(parse_config("nosuch@0.1"), Error);
  CHECK_THROWS_AS(parse_config("quest@2"), Error);
  CHECK_THROWS_AS(parse_config("quest@x"), Error);
  CHECK_THROWS_AS(parse_config("tiered:quest@0.1"), Error);
  // Hierarchical's parameters: round trip, applied, refused where unknown, malformed or out of range.
  for (const char* s : {"hierarchical{min_scored=1}@0.0625", "tiered:hierarchical{expand=4;pair_radii=0}@0.015625"})
    CHECK(parse_config(s).name() == s);
  index::HierarchicalParams h;
  parse_config("hierarchical{min_scored=1;pages_per_cluster=8}@0.0625").apply(h);
  CHECK(h.min_scored == 1.0);
  CHECK(h.pages_per_cluster == 8);
  parse_config("hierarchical{radius_weight=1;pair_weight=0.25}@0.0625").apply(h);
  CHECK(h.radius_weight == 1.0f);
  CHECK(h.pair_weight == 0.25f);
  CHECK(h.expand == index::HierarchicalParams{}.expand);
  CHECK(parse_config("hierarchical{min_scored=1}@0.0625") != parse_config("hierarchical@0.0625"));
  CHECK_THROWS_AS(parse_config("quest{expand=2}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("hierarchical{colour=2}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("hierarchical{expand}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("hierarchical{expand=x}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("hierarchical{min_scored=2}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("hierarchical{radius_weight=-1}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("hierarchical{expand=2@0.1"), Error);
  // The focus carry: any index takes it; values the manager refuses are refused here.
  FocusCarry carry;
  parse_config("quest{carry_share=0}@0.0625").apply(carry);
  CHECK(carry.share == 0.0f);
  CHECK_FALSE(carry.enabled());
  parse_config("hierarchical{carry_mass=0.2;min_scored=1}@0.0625").apply(carry);
  CHECK(carry.mass == 0.2f);
  CHECK(parse_config("mean-key{carry_share=0.5}@0.0625").name() == "mean-key{carry_share=0.5}@0.0625");
  CHECK_THROWS_AS(parse_config("quest{carry_share=1}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("quest{carry_mass=0}@0.1"), Error);
  // Token-level rescoring wraps hierarchical, quest or mean-key, with a pool of at least the budget.
  const ConfigSpec rescored = parse_config("tiered:hierarchical{rescore_pool=3;rescore_max=1;expand=4}@0.0625");
  CHECK(rescored.rescored());
  CHECK_FALSE(parse_config("hierarchical{rescore_pool=0}@0.0625").rescored());
  index::TokenRescoreParams r;
  rescored.apply(r);
  CHECK(r.pool == 3.0);
  CHECK(r.max_token);
  CHECK_THROWS_AS(parse_config("quest{rescore_pool=0.5}@0.1"), Error);
  CHECK_THROWS_AS(parse_config("centroid{rescore_pool=4}@0.1"), Error);
  CHECK(default_configs({0.0625, 0.015625}).size() == 1 + 2 * (kSparseIndices.size() + 1));
}

TEST_CASE("longbench truncate: the first P tokens of a prefill snapshot are a P-token prefill's K/V, bit for bit") {
  ThreadPool pool(2);
  const llama::Model m = llama::make_synthetic(*llama::parse_synthetic("synthetic:tiny"), {}, pool);
  llama::RunOptions o;
  const Config cfg = llama::manager_config(o, m.config);
  std::vector<int> ids;
  for (int i = 0; i < 300; ++i) ids.push_back(1 + (i * 37) % (m.config.vocab - 1));
  const auto snapshot = [&](std::size_t n) {
    llama::PrefillSnapshot s;
    KvManager<index::Dense, eviction::None> kv(cfg);
    llama::Decoder<decltype(kv)> dec(m, kv, pool, 64);
    dec.keep_prefill(&s);
    dec.prefill(std::span<const int>(ids.data(), n));
    return s;
  };
  const llama::PrefillSnapshot full = snapshot(300), part = snapshot(130);
  const llama::PrefillSnapshot cut = truncate(full, 130, part.logits);
  REQUIRE(cut.k.size() == part.k.size());
  for (std::size_t l = 0; l < cut.k.size(); ++l) {
    REQUIRE(cut.k[l].size() == part.k[l].size());
    CHECK(std::memcmp(cut.k[l].data(), part.k[l].data(), cut.k[l].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(cut.v[l].data(), part.v[l].data(), cut.v[l].size() * sizeof(float)) == 0);
  }
  // A dense replay from the cut and from the real prefill decodes the same logits.
  ReplayContext cx{&m, &pool, o};
  ReplayPlan plan;
  plan.forced = std::span<const int>(ids.data() + 130, 8);
  CHECK(same_bits(replay(cx, ConfigSpec{}, cut, plan), replay(cx, ConfigSpec{}, part, plan)));
  CHECK_THROWS_AS(truncate(full, 301, {}), Error);
}
