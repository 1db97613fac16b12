// Fidelity of the emulated frontiers against the Kareus artifact's measured ones (artifact.h):
// per workload and method, the fastest iteration time, the energy at the fastest point and the
// least energy, measured against emulated, with the relative errors; and whether
// Nanobatching+Perseus is faster or slower than Perseus in both (`kareus calibrate --artifact`,
// docs/emulator.md, "Fidelity against the artifact").
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kareus/artifact.h"
#include "kareus/evaluate.h"

namespace kareus {

/// The three figures compared, energies in the artifact's convention (one GPU per stage,
/// summed over the stages, static included).
struct FrontierFigures {
  double fastest_time_s = 0;    ///< max-throughput point (max_throughput_point)
  double fastest_energy_j = 0;  ///< energy of that point
  double least_energy_j = 0;
};

struct FidelityRow {
  std::string workload;
  std::string method;  ///< artifact method: perseus, nanobatch_perseus, kareus
  std::string set;     ///< artifact_set: fit or held-out
  FrontierFigures measured, emulated;
  double fastest_time_error = 0;  ///< emulated / measured - 1
  double fastest_energy_error = 0;
  double least_energy_error = 0;
  /// The largest |error| of the three.
  double worst_abs_error() const;
};

/// Per workload: Nanobatching+Perseus's fastest time against Perseus's (relative difference,
/// nanobatch / perseus - 1), measured and emulated, and whether their signs agree.
struct FidelitySign {
  std::string workload;
  std::string set;
  double measured = 0;
  double emulated = 0;
  bool match = false;
};

struct FidelityReport {
  std::vector<FidelityRow> rows;  ///< in the order of the measured frontiers
  std::vector<FidelitySign> signs;
  double worst_fit_error = 0;       ///< largest |error| over the fit rows
  double worst_held_out_error = 0;  ///< largest |error| over the held-out rows
  int sign_matches = 0;
};

/// The emulated frontier the artifact's `method` is compared with: Megatron-LM+Perseus for
/// perseus, Nanobatching+Perseus for nanobatch_perseus, Kareus's own frontier (no fallback to a
/// baseline's plan) for kareus. Throws InvalidInput for another method.
const std::vector<FrontierSummaryPoint>& emulated_frontier(const WorkloadEvaluation& e,
                                                           const std::string& method);
/// Kareus's display name of the method an artifact method is compared with ("Perseus", ...).
std::string emulated_method_name(const std::string& method);

/// The figures of a frontier; `energy_divisor` converts its energies (whole-job energy / GPUs
/// per stage for an evaluation's, 1 for the artifact's). Throws InternalError for an empty one.
FrontierFigures frontier_figures(const std::vector<FrontierSummaryPoint>& points,
                                 double energy_divisor);

/// An evaluation and its workload's GPUs per pipeline stage (tp x cp x dp), which converts its
/// whole-job energies to the artifact's convention.
// clang-tidy 14 reports this aggregate's implicit special members under
// bugprone-exception-escape without naming a throw site (as for WorkloadEvaluation).
// NOLINTNEXTLINE(bugprone-exception-escape)
struct EmulatedWorkload {
  WorkloadEvaluation evaluation;
  int gpus_per_stage = 1;
};

/// Compares every measured frontier with the emulated one of its workload (`emulated`, by
/// workload name); a workload missing from `emulated` is an InvalidInput.
FidelityReport artifact_fidelity(const std::vector<ArtifactFrontier>& measured,
                                 const std::map<std::string, EmulatedWorkload>& emulated);

nlohmann::json to_json(const FidelityReport& r);
/// The table `kareus calibrate --artifact` prints: one row per workload and method, then the
/// sign table and the summary line.
std::string fidelity_text(const FidelityReport& r);

}  // namespace kareus
