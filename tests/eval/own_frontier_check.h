// Kareus's OWN frontier (without falling back to a baseline's plans) against each baseline,
// computed here from an evaluation's JSON independently of src/eval, and compared with the
// losses recorded per workload in tests/eval/data/own_frontier_losses.json. The merged frontier
// cannot lose to its own parts, so only the own frontier can show that planning works: a
// planner that ignores a knob (say the SM count) loses more, or somewhere new, and fails here.
// Set KAREUS_RECORD_OWN_LOSSES=PATH to write the observed losses in the recorded format (after a
// deliberate change of the emulator or the planner; review the diff before committing it).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"

namespace kareus::test {

struct OwnLoss {
  int deadlines = 0, lost = 0;
  double worst_excess_pct = 0, from_s = 0, to_s = 0;
};

// Least energy among points no slower than `deadline` (1e300 when none is).
inline double best_energy_within(const nlohmann::json& pts, double deadline) {
  double best = 1e300;
  for (const auto& p : pts) {
    if (p.at("iteration_time_s").get<double>() <= deadline) {
      best = std::min(best, p.at("energy_j").get<double>());
    }
  }
  return best;
}

// Every deadline both frontiers can meet: each point time of either from the later of the two
// fastest times on. Lost: the own frontier's least energy exceeds the baseline's.
inline OwnLoss own_loss(const nlohmann::json& own, const nlohmann::json& base) {
  auto fastest = [](const nlohmann::json& v) {
    double t = 1e300;
    for (const auto& p : v) t = std::min(t, p.at("iteration_time_s").get<double>());
    return t;
  };
  const double lo = std::max(fastest(own), fastest(base));
  std::vector<double> ds;
  for (const auto* v : {&own, &base}) {
    for (const auto& p : *v) {
      const double t = p.at("iteration_time_s").get<double>();
      if (t >= lo) ds.push_back(t);
    }
  }
  std::sort(ds.begin(), ds.end());
  ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
  OwnLoss l;
  for (double d : ds) {
    ++l.deadlines;
    const double eo = best_energy_within(own, d), eb = best_energy_within(base, d);
    if (eo <= eb * (1 + 1e-9)) continue;
    if (l.lost++ == 0) l.from_s = d;
    l.to_s = d;
    l.worst_excess_pct = std::max(l.worst_excess_pct, 100 * (eo / eb - 1));
  }
  return l;
}

/// Checks each evaluation of `evals` (eval --json) against the recorded losses; prints a table of
/// where Kareus's own frontier loses.
inline void check_own_frontier_losses(const nlohmann::json& evals) {
  const auto recorded =
      nlohmann::json::parse(read_file(source_path("tests/eval/data/own_frontier_losses.json")));
  const double tol = recorded.at("tolerance_pct").get<double>();
  nlohmann::json observed = recorded;
  std::cout << "Kareus's own frontier against the baselines (lost deadlines / compared, worst "
               "energy excess):\n";
  for (const auto& w : evals) {
    const std::string name = w.at("workload");
    const auto& own = w.at("kareus_without_fallback");
    std::string line = "  " + name + ":";
    for (const char* base : {"perseus", "nanobatch_perseus"}) {
      const OwnLoss l = own_loss(own, w.at(base));
      // The evaluation's own record says the same.
      bool found = false;
      for (const auto& r : w.at("own_frontier").at("losses")) {
        if (r.at("baseline") != base) continue;
        found = true;
        EXPECT_EQ(r.at("lost").get<int>(), l.lost) << name << " vs " << base;
        EXPECT_EQ(r.at("deadlines").get<int>(), l.deadlines) << name << " vs " << base;
        EXPECT_NEAR(r.at("worst_excess_pct").get<double>(), l.worst_excess_pct, 1e-9)
            << name << " vs " << base;
      }
      EXPECT_TRUE(found) << name << " vs " << base;
      line += fmt::format(" {} {}/{} ({:.2f}%{})", base, l.lost, l.deadlines, l.worst_excess_pct,
                          l.lost ? fmt::format(", {:.3f}..{:.3f} s", l.from_s, l.to_s) : "");
      observed["workloads"][name][base] = {
          {"lost", l.lost}, {"deadlines", l.deadlines}, {"worst_excess_pct", l.worst_excess_pct}};
      if (!recorded.at("workloads").contains(name)) {
        ADD_FAILURE() << name << ": no recorded losses in tests/eval/data/own_frontier_losses.json";
        continue;
      }
      const auto& rec = recorded.at("workloads").at(name).at(base);
      EXPECT_LE(l.worst_excess_pct, rec.at("worst_excess_pct").get<double>() + tol)
          << name << ": Kareus's own frontier loses to " << base << " at " << l.lost << " of "
          << l.deadlines << " deadlines (" << l.from_s << ".." << l.to_s << " s) by up to "
          << l.worst_excess_pct << "% energy; recorded: " << rec.at("lost").get<int>()
          << " deadlines, up to " << rec.at("worst_excess_pct").get<double>() << "% (tolerance "
          << tol << " points)";
    }
    std::cout << line << "\n";
  }
  if (const char* path = std::getenv("KAREUS_RECORD_OWN_LOSSES")) {
    std::ofstream(path) << observed.dump(1) << "\n";
  }
}

}  // namespace kareus::test
