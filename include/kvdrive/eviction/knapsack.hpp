// Window allocation by multiple-choice knapsack (KVDrive's 2D window scaling). Each (layer,
// head) is a class whose items are its windows W = 0..Wmax, each with a benefit (traffic saved
// per step) and a cost (cache bytes); pick one item per class, total cost within the budget,
// total benefit as large as possible.
//   solve_greedy  the paper's method: walk each class's upper convex hull, always taking the
//                 increment with the best benefit per byte that still fits. Never above the
//                 optimum; below it by at most one increment's benefit.
//   solve_exact   a dynamic program over the budget in units of the costs' common divisor,
//                 cheap for a few hundred classes when costs are multiples of one step's bytes.
// plan_windows() turns a WindowProfile (measured by eval/window_profile.hpp) into a WindowPlan.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/eviction/window_plan.hpp"

namespace kvdrive::eviction {

struct KnapsackItem {
  std::int64_t cost = 0;  ///< >= 0
  double benefit = 0;
};
using KnapsackClass = std::vector<KnapsackItem>;

struct KnapsackSolution {
  std::vector<int> choice;  ///< item index per class
  std::int64_t cost = 0;
  double benefit = 0;
};

namespace knapsack_detail {
inline void check(const std::vector<KnapsackClass>& classes, std::int64_t budget) {
  KVD_EXPECT(budget >= 0, "knapsack: budget {} is negative", budget);
  std::int64_t least = 0;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    KVD_EXPECT(!classes[c].empty() && classes[c].size() <= 32767, "knapsack: class {} has {} items (expected 1..32767)", c, classes[c].size());
    std::int64_t m = std::numeric_limits<std::int64_t>::max();
    for (const KnapsackItem& it : classes[c]) {
      KVD_EXPECT(it.cost >= 0, "knapsack: class {} has an item of negative cost {}", c, it.cost);
      KVD_EXPECT(std::isfinite(it.benefit), "knapsack: class {} has an item of benefit {}", c, it.benefit);
      m = std::min(m, it.cost);
    }
    KVD_EXPECT(!__builtin_add_overflow(least, m, &least), "knapsack: the cheapest choice's cost overflows 64 bits");
  }
  KVD_EXPECT(least <= budget, "knapsack: the cheapest choice costs {}, over the budget of {}", least, budget);
}
inline KnapsackSolution total(const std::vector<KnapsackClass>& classes, std::vector<int> choice) {
  KnapsackSolution s;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    s.cost += classes[c][static_cast<std::size_t>(choice[c])].cost;
    s.benefit += classes[c][static_cast<std::size_t>(choice[c])].benefit;
  }
  s.choice = std::move(choice);
  return s;
}

/// One move along a class's hull, from the item before it to `to`.
struct HullStep {
  double ratio;           // benefit per unit of cost
  std::size_t cls, rank;  // rank: position along the class's hull
  int to;                 // the item this step moves to
  std::int64_t dcost;
};

/// The upper convex hull of a class's (cost, benefit) points from its cheapest item, dominated
/// items dropped: item indices, cost ascending.
inline std::vector<int> upper_hull(const KnapsackClass& items) {
  std::vector<int> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const KnapsackItem &x = items[static_cast<std::size_t>(a)], &y = items[static_cast<std::size_t>(b)];
    return x.cost != y.cost ? x.cost < y.cost : x.benefit > y.benefit;
  });
  std::vector<int> hull;
  for (int i : order) {
    const KnapsackItem& it = items[static_cast<std::size_t>(i)];
    if (!hull.empty() && it.benefit <= items[static_cast<std::size_t>(hull.back())].benefit) continue;
    while (hull.size() >= 2) {
      const KnapsackItem& a = items[static_cast<std::size_t>(hull[hull.size() - 2])];
      const KnapsackItem& b = items[static_cast<std::size_t>(hull.back())];
      // b lies on or below the segment a -> it: drop it.
      if ((b.benefit - a.benefit) * static_cast<double>(it.cost - a.cost) <= (it.benefit - a.benefit) * static_cast<double>(b.cost - a.cost))
        hull.pop_back();
      else break;
    }
    hull.push_back(i);
  }
  return hull;
}

/// Appends the steps along class c's hull (one per hull item after the first) to `steps`.
inline void add_hull_steps(std::size_t c, const KnapsackClass& items, const std::vector<int>& hull, std::vector<HullStep>& steps) {
  for (std::size_t k = 1; k < hull.size(); ++k) {
    const KnapsackItem& a = items[static_cast<std::size_t>(hull[k - 1])];
    const KnapsackItem& b = items[static_cast<std::size_t>(hull[k])];
    const std::int64_t dc = b.cost - a.cost;
    const double db = b.benefit - a.benefit;
    steps.push_back({dc > 0 ? db / static_cast<double>(dc) : std::numeric_limits<double>::infinity(), c, k, hull[k], dc});
  }
}

/// Takes the steps (best ratio first) that still fit the budget, each class's in hull order,
/// starting from `choice` (every class at its cheapest item).
inline void take_steps(const std::vector<KnapsackClass>& classes, std::int64_t budget, const std::vector<HullStep>& steps, std::vector<int>& choice) {
  std::int64_t left = budget;
  for (std::size_t c = 0; c < classes.size(); ++c) left -= classes[c][static_cast<std::size_t>(choice[c])].cost;
  std::vector<std::size_t> taken(classes.size(), 0);  // hull steps taken per class
  std::vector<bool> closed(classes.size(), false);
  for (const HullStep& s : steps) {
    if (closed[s.cls] || taken[s.cls] + 1 != s.rank) continue;  // a class's steps go in hull order
    if (s.dcost > left) {
      closed[s.cls] = true;  // its later steps build on this one
      continue;
    }
    left -= s.dcost;
    choice[s.cls] = s.to;
    ++taken[s.cls];
  }
}
}  // namespace knapsack_detail

inline KnapsackSolution solve_greedy(const std::vector<KnapsackClass>& classes, std::int64_t budget) {
  using knapsack_detail::HullStep;
  knapsack_detail::check(classes, budget);
  std::vector<int> choice(classes.size());
  std::vector<HullStep> steps;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    const std::vector<int> hull = knapsack_detail::upper_hull(classes[c]);
    choice[c] = hull.front();
    knapsack_detail::add_hull_steps(c, classes[c], hull, steps);
  }
  std::stable_sort(steps.begin(), steps.end(), [](const HullStep& a, const HullStep& b) {
    return a.ratio != b.ratio ? a.ratio > b.ratio : (a.cls != b.cls ? a.cls < b.cls : a.rank < b.rank);
  });
  knapsack_detail::take_steps(classes, budget, steps, choice);
  return knapsack_detail::total(classes, std::move(choice));
}

/// The optimum. Throws if the budget in units of the costs' common divisor makes the table
/// larger than `max_cells` (2 bytes each): cheap when costs are multiples of one step's bytes,
/// as window profiles' are; arbitrary byte costs need solve_greedy.
inline KnapsackSolution solve_exact(const std::vector<KnapsackClass>& classes, std::int64_t budget, std::int64_t max_cells = std::int64_t{1} << 27) {
  knapsack_detail::check(classes, budget);
  std::int64_t unit = 0;
  for (const KnapsackClass& cl : classes)
    for (const KnapsackItem& it : cl) unit = std::gcd(unit, it.cost);
  if (unit == 0) unit = 1;
  const std::int64_t cap = budget / unit;
  KVD_EXPECT(static_cast<double>(cap + 1) * static_cast<double>(classes.size()) <= static_cast<double>(max_cells),
             "knapsack: an exact solve needs {} x {} cells (budget {} in units of {}); use solve_greedy", classes.size(), cap + 1, budget, unit);
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  const auto width = static_cast<std::size_t>(cap + 1);
  std::vector<double> best(width, 0.0), next(width);
  std::vector<std::int16_t> pick(classes.size() * width, -1);  // the item chosen per (class, budget)
  for (std::size_t c = 0; c < classes.size(); ++c) {
    std::fill(next.begin(), next.end(), kNone);
    for (std::size_t b = 0; b < width; ++b)
      for (std::size_t i = 0; i < classes[c].size(); ++i) {
        const std::int64_t w = classes[c][i].cost / unit;
        if (w > static_cast<std::int64_t>(b) || best[b - static_cast<std::size_t>(w)] == kNone) continue;
        const double v = best[b - static_cast<std::size_t>(w)] + classes[c][i].benefit;
        if (v > next[b]) {
          next[b] = v;
          pick[c * width + b] = static_cast<std::int16_t>(i);
        }
      }
    best.swap(next);
  }
  std::size_t b = width - 1;  // best[] is monotone in b: every cell allows spending less
  std::vector<int> choice(classes.size());
  for (std::size_t c = classes.size(); c-- > 0;) {
    const int i = pick[c * width + b];
    choice[c] = i;
    b -= static_cast<std::size_t>(classes[c][static_cast<std::size_t>(i)].cost / unit);
  }
  return knapsack_detail::total(classes, std::move(choice));
}

/// What each window is worth to each stream: measured on a calibration trace.
struct WindowProfile {
  int layers = 0, kv_heads = 0, max_window = 0;
  std::vector<double> saved;       ///< [stream][W]: bytes per step not fetched thanks to the cache
  std::vector<std::int64_t> cost;  ///< [stream][W]: the cache's bytes

  std::size_t streams() const { return static_cast<std::size_t>(layers) * kv_heads; }
  std::size_t at(std::size_t stream, int w) const { return stream * static_cast<std::size_t>(max_window + 1) + static_cast<std::size_t>(w); }

  void validate() const {
    KVD_EXPECT(layers > 0 && kv_heads > 0 && max_window >= 0, "window profile: {} x {} streams, max W {}", layers, kv_heads, max_window);
    KVD_EXPECT(saved.size() == streams() * static_cast<std::size_t>(max_window + 1) && cost.size() == saved.size(),
               "window profile: {} benefits and {} costs for {} streams x {} windows", saved.size(), cost.size(), streams(), max_window + 1);
  }
};

enum class KnapsackSolver { greedy, exact };

/// One W per stream from the profile, its caches' bytes within `cache_bytes`.
inline WindowPlan plan_windows(const WindowProfile& p, std::int64_t cache_bytes, KnapsackSolver solver = KnapsackSolver::greedy) {
  p.validate();
  std::vector<KnapsackClass> classes(p.streams());
  for (std::size_t s = 0; s < p.streams(); ++s)
    for (int w = 0; w <= p.max_window; ++w) classes[s].push_back({p.cost[p.at(s, w)], p.saved[p.at(s, w)]});
  const KnapsackSolution sol = solver == KnapsackSolver::exact ? solve_exact(classes, cache_bytes) : solve_greedy(classes, cache_bytes);
  return WindowPlan{p.layers, p.kv_heads, sol.choice};
}

}  // namespace kvdrive::eviction
