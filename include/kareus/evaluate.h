// End-to-end evaluation of one workload, as in the paper (brief section 8): Kareus against
// Megatron-LM, Perseus, Nanobatching and Nanobatching + Perseus, and two ablations, every method
// through the same composition and frontier solver on the same measurements. Kareus's reported
// frontier never loses to a baseline: where a baseline plan is better, Kareus falls back to it
// and says so.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kareus/planner.h"

namespace kareus {

struct FrontierSummaryPoint {
  double iteration_time_s = 0;
  double energy_j = 0;
  std::string method;  ///< which method's plan (for Kareus's merged frontier)
};

struct ReplayCheck {
  std::string plan;
  double predicted_time_s = 0, emulated_time_s = 0;
  double predicted_energy_j = 0, emulated_energy_j = 0;
  double time_error() const { return emulated_time_s / predicted_time_s - 1.0; }
  double energy_error() const { return emulated_energy_j / predicted_energy_j - 1.0; }
};

struct WorkloadEvaluation {
  std::string workload;
  int gpus = 0;
  // Profiling cost.
  int measured = 0;
  int reused = 0;
  std::vector<PartitionSearchSummary> searches;
  double real_gpu_hours = 0;  ///< measured points x (5 s + 5 s), on one node
  // Frontiers (whole-job energy per iteration).
  std::vector<FrontierSummaryPoint> kareus;  ///< merged with the baselines where they win
  std::vector<FrontierSummaryPoint> kareus_only;
  std::vector<FrontierSummaryPoint> perseus;
  std::vector<FrontierSummaryPoint> nanobatch_perseus;
  std::vector<FrontierSummaryPoint> kareus_max_clock;
  FrontierSummaryPoint megatron;
  FrontierSummaryPoint nanobatch;
  bool fallback = false;  ///< some Kareus operating point is a baseline's plan
  std::string fallback_note;
  // Metrics (percent).
  double iso_time_energy_saving_pct = 0;
  double iso_energy_time_saving_pct = 0;
  double max_throughput_time_saving_pct = 0;
  double max_throughput_energy_saving_pct = 0;
  double ablation_no_freq_energy_increase_pct = 0;
  double ablation_no_sched_energy_increase_pct = 0;
  // Operating points behind the metrics.
  FrontierSummaryPoint perseus_fastest, perseus_min_energy, iso_time_point, iso_energy_point;
  std::map<std::string, Plan> plans;  ///< max-throughput, min-energy, iso-time, iso-energy
  std::vector<ReplayCheck> replays;
  nlohmann::json frontier_plans;  ///< every Kareus frontier point with its plan (if collected)
  double seconds = 0;             ///< wall time of the evaluation
};

/// Runs the whole pipeline and every baseline for one workload.
WorkloadEvaluation evaluate_workload(const Workload& w, CachedProfiler& profiler,
                                     const PlannerOptions& o, const PlannerProgress& progress = {},
                                     bool collect_frontier_plans = false);

nlohmann::json to_json(const WorkloadEvaluation& e, bool with_plans);

/// The paper's headline figures (brief section 8), for context beside ours.
struct PaperHeadline {
  static constexpr double iso_time_energy_saving_pct = 28.3;
  static constexpr double iso_energy_time_saving_pct = 27.5;
  static constexpr double max_throughput_time_saving_pct = 14.9;
  static constexpr double max_throughput_energy_saving_pct = 22.1;
  static constexpr double ablation_no_sched_energy_increase_pct = 10.8;
};

/// Markdown report of one workload (kareus optimize): cost, comparison table, plot.
std::string workload_report(const WorkloadEvaluation& e, const std::string& png_name);
/// The comparison table alone (also printed by `kareus optimize` and `make run`).
std::string comparison_table(const WorkloadEvaluation& e);
/// Markdown report of a suite (kareus eval): one row per workload, summary, paper figures.
std::string suite_report(const std::vector<WorkloadEvaluation>& all, double seconds);

/// Draws the frontiers with matplotlib (Debian's python3-matplotlib). Returns false, with the
/// reason in `error`, when no plot could be made; the caller reports it, nothing crashes.
bool plot_frontiers(const WorkloadEvaluation& e, const std::string& png_path, std::string& error);

}  // namespace kareus
