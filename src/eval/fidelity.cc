// Measured (Kareus artifact) against emulated frontiers (fidelity.h).
#include "kareus/fidelity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kareus/error.h"
#include "kareus/table.h"

namespace kareus {

namespace {

Method compared_method(const std::string& method) {
  if (method == "perseus") return Method::kPerseus;
  if (method == "nanobatch_perseus") return Method::kNanobatchPerseus;
  if (method == "kareus") return Method::kKareus;
  throw InvalidInput(fmt::format(
      "artifact method '{}': allowed values: perseus, nanobatch_perseus, kareus", method));
}

std::string pct(double x) { return fmt::format("{:+.1f}%", 100 * x); }

int sign(double x) { return (x > 0) - (x < 0); }

const FidelityRow* find_row(const FidelityReport& r, const std::string& workload,
                            const std::string& method) {
  for (const auto& x : r.rows) {
    if (x.workload == workload && x.method == method) return &x;
  }
  return nullptr;
}

nlohmann::json figures_json(const FrontierFigures& f) {
  return {{"fastest_time_s", f.fastest_time_s},
          {"fastest_energy_j", f.fastest_energy_j},
          {"least_energy_j", f.least_energy_j}};
}

}  // namespace

double FidelityRow::worst_abs_error() const {
  return std::max(
      {std::abs(fastest_time_error), std::abs(fastest_energy_error), std::abs(least_energy_error)});
}

const std::vector<FrontierSummaryPoint>& emulated_frontier(const WorkloadEvaluation& e,
                                                           const std::string& method) {
  switch (compared_method(method)) {
    case Method::kPerseus:
      return e.perseus;
    case Method::kNanobatchPerseus:
      return e.nanobatch_perseus;
    default:
      return e.kareus_only;
  }
}

std::string emulated_method_name(const std::string& method) {
  return display_name(compared_method(method));
}

FrontierFigures frontier_figures(const std::vector<FrontierSummaryPoint>& points,
                                 double energy_divisor) {
  const FrontierSummaryPoint& fast = max_throughput_point(points);  // throws when empty
  FrontierFigures f;
  f.fastest_time_s = fast.iteration_time_s;
  f.fastest_energy_j = fast.energy_j / energy_divisor;
  f.least_energy_j =
      std::min_element(points.begin(), points.end(),
                       [](const auto& a, const auto& b) { return a.energy_j < b.energy_j; })
          ->energy_j /
      energy_divisor;
  return f;
}

FidelityReport artifact_fidelity(const std::vector<ArtifactFrontier>& measured,
                                 const std::map<std::string, EmulatedWorkload>& emulated) {
  FidelityReport r;
  std::vector<std::string> workloads;
  for (const auto& m : measured) {
    const auto it = emulated.find(m.workload);
    if (it == emulated.end()) {
      throw InvalidInput(fmt::format("artifact workload {}: no emulated evaluation", m.workload));
    }
    std::vector<FrontierSummaryPoint> pts;
    for (const auto& p : m.points) pts.push_back({p.time_s, p.energy_j, m.method});
    FidelityRow row;
    row.workload = m.workload;
    row.method = m.method;
    row.set = artifact_set(m.workload);
    row.measured = frontier_figures(pts, 1.0);
    row.emulated = frontier_figures(emulated_frontier(it->second.evaluation, m.method),
                                    it->second.gpus_per_stage);
    row.fastest_time_error = row.emulated.fastest_time_s / row.measured.fastest_time_s - 1;
    row.fastest_energy_error = row.emulated.fastest_energy_j / row.measured.fastest_energy_j - 1;
    row.least_energy_error = row.emulated.least_energy_j / row.measured.least_energy_j - 1;
    double& worst = row.set == "fit" ? r.worst_fit_error : r.worst_held_out_error;
    worst = std::max(worst, row.worst_abs_error());
    r.rows.push_back(row);
    if (std::find(workloads.begin(), workloads.end(), m.workload) == workloads.end()) {
      workloads.push_back(m.workload);
    }
  }
  for (const auto& w : workloads) {
    const FidelityRow* p = find_row(r, w, "perseus");
    const FidelityRow* n = find_row(r, w, "nanobatch_perseus");
    if (!p || !n) continue;
    FidelitySign s;
    s.workload = w;
    s.set = artifact_set(w);
    s.measured = n->measured.fastest_time_s / p->measured.fastest_time_s - 1;
    s.emulated = n->emulated.fastest_time_s / p->emulated.fastest_time_s - 1;
    s.match = sign(s.measured) == sign(s.emulated);
    r.sign_matches += s.match ? 1 : 0;
    r.signs.push_back(s);
  }
  return r;
}

nlohmann::json to_json(const FidelityReport& r) {
  nlohmann::json j;
  j["rows"] = nlohmann::json::array();
  for (const auto& x : r.rows) {
    j["rows"].push_back({{"workload", x.workload},
                         {"method", x.method},
                         {"emulated_method", emulated_method_name(x.method)},
                         {"set", x.set},
                         {"measured", figures_json(x.measured)},
                         {"emulated", figures_json(x.emulated)},
                         {"fastest_time_error", x.fastest_time_error},
                         {"fastest_energy_error", x.fastest_energy_error},
                         {"least_energy_error", x.least_energy_error}});
  }
  j["signs"] = nlohmann::json::array();
  for (const auto& s : r.signs) {
    j["signs"].push_back({{"workload", s.workload},
                          {"set", s.set},
                          {"measured", s.measured},
                          {"emulated", s.emulated},
                          {"match", s.match}});
  }
  j["summary"] = {{"worst_fit_error", r.worst_fit_error},
                  {"worst_held_out_error", r.worst_held_out_error},
                  {"sign_matches", r.sign_matches},
                  {"sign_workloads", r.signs.size()}};
  return j;
}

std::string fidelity_text(const FidelityReport& r) {
  TextTable t({"workload", "set", "method", "fastest s meas", "emu", "error", "J at fastest meas",
               "emu", "error", "least J meas", "emu", "error"});
  for (const auto& x : r.rows) {
    t.add_row({x.workload, x.set, emulated_method_name(x.method),
               fmt::format("{:.3f}", x.measured.fastest_time_s),
               fmt::format("{:.3f}", x.emulated.fastest_time_s), pct(x.fastest_time_error),
               fmt::format("{:.1f}", x.measured.fastest_energy_j),
               fmt::format("{:.1f}", x.emulated.fastest_energy_j), pct(x.fastest_energy_error),
               fmt::format("{:.1f}", x.measured.least_energy_j),
               fmt::format("{:.1f}", x.emulated.least_energy_j), pct(x.least_energy_error)});
  }
  TextTable s({"workload", "set", "Nanobatching+Perseus vs Perseus fastest: measured", "emulated",
               "sign match"});
  for (const auto& x : r.signs) {
    s.add_row({x.workload, x.set, pct(x.measured), pct(x.emulated), x.match ? "yes" : "no"});
  }
  auto worst = [&r](const std::string& set, double value) {
    const bool any = std::any_of(r.rows.begin(), r.rows.end(),
                                 [&set](const FidelityRow& x) { return x.set == set; });
    return any ? fmt::format("{:.1f}%", 100 * value) : std::string("none");
  };
  return "energies: one GPU per pipeline stage, summed over the stages, static included\n" +
         t.render() + "\n" + s.render() +
         fmt::format(
             "\nworst |error|: fit {}, held-out {}; sign of Nanobatching+Perseus's fastest time "
             "against Perseus's matches on {} of {} workloads\n",
             worst("fit", r.worst_fit_error), worst("held-out", r.worst_held_out_error),
             r.sign_matches, r.signs.size());
}

}  // namespace kareus
