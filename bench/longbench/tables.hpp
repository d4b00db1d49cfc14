// kvd-longbench's report on the tasks: samples grouped into cells (task, haystack, context) and
// each configuration's figures over a cell's samples, printed as tables (per cell, pooled where
// dense works, per needle depth band) and written as JSON (every cell and every sample).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "replay.hpp"
#include "sample.hpp"
#include "stats.hpp"
#include "tasks.hpp"

namespace kvdrive::longbench {

/// A cell's figures: the samples of one (task, haystack, context) under one configuration.
struct Cell {
  Interval accuracy;
  double agreement = 0;    ///< samples whose score equals dense's
  double same_tokens = 0;  ///< samples whose reply is dense's, token for token
  double ms_per_token = 0;
  double pages_per_step = 0;
};

inline Cell cell_of(const std::vector<const Sample*>& samples, std::size_t config) {
  Cell c;
  std::vector<double> scores;
  for (const Sample* s : samples) {
    const Answer& a = s->by_config[config];
    scores.push_back(a.score);
    c.agreement += a.score == s->by_config[0].score;
    c.same_tokens += a.same_tokens;
    c.ms_per_token += a.ms_per_token;
    c.pages_per_step += a.pages_per_step;
  }
  const double n = static_cast<double>(std::max<std::size_t>(1, samples.size()));
  c.accuracy = interval95(scores);
  c.agreement /= n, c.same_tokens /= n, c.ms_per_token /= n, c.pages_per_step /= n;
  return c;
}

inline std::string cell_text(const Interval& i) { return fmt::format("{:.2f} [{:.2f},{:.2f}]", i.mean, i.low, i.high); }

using Key = std::tuple<int, int, std::int64_t>;  // task, haystack, context

inline std::map<Key, std::vector<const Sample*>> by_cell(const std::vector<Sample>& samples) {
  std::map<Key, std::vector<const Sample*>> m;
  for (const auto& s : samples) m[{static_cast<int>(s.spec.kind), static_cast<int>(s.spec.haystack), s.spec.context}].push_back(&s);
  return m;
}

/// Per (haystack, context): a row per configuration, accuracy per task with its interval, then
/// the pooled accuracy, agreement with dense and decode time.
inline void print_tables(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs, const std::vector<TaskKind>& tasks) {
  const auto cells = by_cell(samples);
  std::map<std::pair<int, std::int64_t>, std::vector<const Sample*>> blocks;
  for (const auto& s : samples) blocks[{static_cast<int>(s.spec.haystack), s.spec.context}].push_back(&s);
  for (const auto& [hc, all] : blocks) {
    fmt::print("\n{} haystack, {} tokens: accuracy [95% interval] per task ({} samples per task)\n", haystack_name(static_cast<Haystack>(hc.first)),
               hc.second, all.size() / tasks.size());
    fmt::print("{:<26}", "configuration");
    for (TaskKind t : tasks) fmt::print(" {:>18}", task_name(t));
    fmt::print(" {:>18} {:>7} {:>7} {:>8} {:>8}\n", "pooled", "agree", "tokens", "ms/tok", "pages");
    for (std::size_t c = 0; c < configs.size(); ++c) {
      fmt::print("{:<26}", configs[c].name());
      for (TaskKind t : tasks) {
        const auto it = cells.find({static_cast<int>(t), hc.first, hc.second});
        fmt::print(" {:>18}", it == cells.end() ? "-" : cell_text(cell_of(it->second, c).accuracy));
      }
      const Cell p = cell_of(all, c);
      fmt::print(" {:>18} {:>7.2f} {:>7.2f} {:>8.1f} {:>8.2f}\n", cell_text(p.accuracy), p.agreement, p.same_tokens, p.ms_per_token,
                 p.pages_per_step);
    }
  }
}

/// Pooled over the cells where dense scores above 0.5 (the tasks the model can do at that
/// length): each configuration's accuracy, its difference from dense, and agreement.
inline nlohmann::json pooled_where_dense_works(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  std::vector<const Sample*> kept;
  std::size_t cells_kept = 0;
  for (const auto& [key, ss] : by_cell(samples))
    if (cell_of(ss, 0).accuracy.mean > 0.5) kept.insert(kept.end(), ss.begin(), ss.end()), ++cells_kept;
  fmt::print(
      "\npooled over the {} cells where dense scores above 0.5 ({} samples); '- dense' is the paired difference "
      "with its 95% interval:\n",
      cells_kept, kept.size());
  fmt::print("{:<26} {:>18} {:>24} {:>7}\n", "configuration", "accuracy", "- dense [95%]", "agree");
  nlohmann::json out = nlohmann::json::array();
  const auto scores = [&](std::size_t c) {
    std::vector<double> v;
    for (const Sample* s : kept) v.push_back(s->by_config[c].score);
    return v;
  };
  const std::vector<double> dense = scores(0);
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const Cell p = cell_of(kept, c);
    const Interval d = paired_difference95(scores(c), dense);
    fmt::print("{:<26} {:>18} {:>24} {:>7.3f}\n", configs[c].name(), cell_text(p.accuracy),
               fmt::format("{:+.3f} [{:+.3f},{:+.3f}]", d.mean, d.low, d.high), p.agreement);
    out.push_back({{"config", configs[c].name()},
                   {"accuracy", p.accuracy.mean},
                   {"low", p.accuracy.low},
                   {"high", p.accuracy.high},
                   {"n", p.accuracy.n},
                   {"agreement", p.agreement},
                   {"minus_dense", d.mean},
                   {"minus_dense_low", d.low},
                   {"minus_dense_high", d.high}});
  }
  return out;
}

/// Per haystack: accuracy pooled over the tasks, per context and depth band of the needle (where
/// the needle, or vt's first statement, stands in the document), with N per band.
inline nlohmann::json print_depth_bands(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  using BandKey = std::tuple<int, std::int64_t, int>;  // haystack, context, band
  std::map<BandKey, std::vector<const Sample*>> bands;
  for (const auto& s : samples) bands[{static_cast<int>(s.spec.haystack), s.spec.context, depth_band(s.spec.depth)}].push_back(&s);
  nlohmann::json out = nlohmann::json::array();
  std::map<int, std::vector<BandKey>> by_haystack;
  for (const auto& [key, ss] : bands) by_haystack[std::get<0>(key)].push_back(key);
  for (const auto& [h, keys] : by_haystack) {
    fmt::print("\n{} haystack: accuracy pooled over the tasks, per context and needle depth band (N)\n", haystack_name(static_cast<Haystack>(h)));
    fmt::print("{:<26}", "configuration");
    for (const auto& k : keys) fmt::print(" {:>16}", fmt::format("{} {} ({})", std::get<1>(k), depth_band_name(std::get<2>(k)), bands[k].size()));
    fmt::print("\n");
    for (std::size_t c = 0; c < configs.size(); ++c) {
      fmt::print("{:<26}", configs[c].name());
      for (const auto& k : keys) {
        const Cell x = cell_of(bands[k], c);
        fmt::print(" {:>16.3f}", x.accuracy.mean);
        out.push_back({{"haystack", haystack_name(static_cast<Haystack>(h))},
                       {"context", std::get<1>(k)},
                       {"band", depth_band_name(std::get<2>(k))},
                       {"config", configs[c].name()},
                       {"accuracy", x.accuracy.mean},
                       {"low", x.accuracy.low},
                       {"high", x.accuracy.high},
                       {"n", x.accuracy.n},
                       {"agreement", x.agreement}});
      }
      fmt::print("\n");
    }
  }
  return out;
}

inline nlohmann::json samples_json(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : samples) {
    nlohmann::json j = {{"task", task_name(s.spec.kind)},
                        {"haystack", haystack_name(s.spec.haystack)},
                        {"context", s.spec.context},
                        {"depth", s.spec.depth},
                        {"seed", s.spec.seed},
                        {"prompt_tokens", s.prompt_tokens},
                        {"document_tokens", s.document_tokens},
                        {"prefill_ms", s.prefill_ms},
                        {"answers", s.answers}};
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Answer& a = s.by_config[c];
      j["configs"][configs[c].name()] = {{"reply", a.text},
                                         {"ids", a.ids},
                                         {"score", a.score},
                                         {"same_tokens", a.same_tokens},
                                         {"same_bits", a.same_bits},
                                         {"ms_per_token", a.ms_per_token},
                                         {"pages_per_step", a.pages_per_step}};
    }
    out.push_back(std::move(j));
  }
  return out;
}

inline nlohmann::json cells_json(const std::vector<Sample>& samples, const std::vector<ConfigSpec>& configs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, ss] : by_cell(samples))
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Cell x = cell_of(ss, c);
      out.push_back({{"task", task_name(static_cast<TaskKind>(std::get<0>(key)))},
                     {"haystack", haystack_name(static_cast<Haystack>(std::get<1>(key)))},
                     {"context", std::get<2>(key)},
                     {"config", configs[c].name()},
                     {"accuracy", x.accuracy.mean},
                     {"low", x.accuracy.low},
                     {"high", x.accuracy.high},
                     {"n", x.accuracy.n},
                     {"agreement", x.agreement},
                     {"same_tokens", x.same_tokens},
                     {"ms_per_token", x.ms_per_token},
                     {"pages_per_step", x.pages_per_step}});
    }
  return out;
}

}  // namespace kvdrive::longbench
