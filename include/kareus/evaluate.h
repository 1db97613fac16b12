// End-to-end evaluation of one workload, as in the paper's evaluation (Wu, Chung, Chowdhury, OSDI
// '26): Kareus against Megatron-LM, Perseus, Nanobatching and Nanobatching + Perseus, and two
// ablations, every method through the same composition and frontier solver on the same
// measurements. Kareus's reported frontier never loses to a baseline: where a baseline plan is
// better, Kareus falls back to it and says so.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kareus/metrics.h"
#include "kareus/planner.h"
#include "kareus/profiling_cost.h"

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

// clang-tidy 14 reports this aggregate's implicit special members (standard containers, json,
// Plan values) under bugprone-exception-escape without naming a throw site.
// NOLINTNEXTLINE(bugprone-exception-escape)
struct WorkloadEvaluation {
  std::string workload;
  int gpus = 0;
  JobShape job;  ///< tokens and model FLOPs per iteration, GPUs, peak: what the metrics need
  // Profiling cost.
  int measured = 0;
  int reused = 0;
  std::vector<PartitionSearchSummary> searches;
  ProfilingCostEstimate profiling_cost;  ///< of measured + reused points on real GPUs
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
  Plan megatron_plan;  ///< Megatron-LM's plan, drawn beside Kareus's in the timelines
  std::vector<ReplayCheck> replays;
  /// Every method's frontier in compact form and the merged Kareus frontier as references
  /// (frontiers_to_json, frontier_file.h), if collected.
  nlohmann::json frontier_plans;
  double seconds = 0;  ///< wall time of the evaluation

  /// Throughput, MFU, energy per token and power per GPU of one point (metrics.h).
  ThroughputMetrics metrics(const FrontierSummaryPoint& p) const {
    return throughput_metrics(job, p.iteration_time_s, p.energy_j);
  }
};

/// Runs the whole pipeline and every baseline for one workload.
WorkloadEvaluation evaluate_workload(const Workload& w, CachedProfiler& profiler,
                                     const PlannerOptions& o, const PlannerProgress& progress = {},
                                     bool collect_frontier_plans = false);

nlohmann::json to_json(const WorkloadEvaluation& e, bool with_plans);

/// The paper's headline figures (Wu, Chung, Chowdhury, OSDI '26), for context beside ours.
struct PaperHeadline {
  static constexpr double iso_time_energy_saving_pct = 28.3;
  static constexpr double iso_energy_time_saving_pct = 27.5;
  static constexpr double max_throughput_time_saving_pct = 14.9;
  static constexpr double max_throughput_energy_saving_pct = 22.1;
  static constexpr double ablation_no_sched_energy_increase_pct = 10.8;
};

/// Markdown report of one workload (kareus optimize): cost, comparison table with metrics, the
/// frontier plot `png_name` (none when empty) and the timelines (plan name -> picture path
/// relative to the report; plans without an entry get none).
std::string workload_report(const WorkloadEvaluation& e, const std::string& png_name,
                            const std::map<std::string, std::string>& timelines = {});
/// The comparison table alone (also printed by `kareus optimize` and `make run`): per method
/// and plan the iteration time, energy, change against Megatron-LM, tokens/s (whole job and per
/// GPU), MFU, energy per token and average power per GPU.
std::string comparison_table(const WorkloadEvaluation& e);
/// Markdown report of a suite (kareus eval): one row per workload, summary, paper figures.
std::string suite_report(const std::vector<WorkloadEvaluation>& all, double seconds);

/// Draws the frontiers with matplotlib (Debian's python3-matplotlib). Returns false, with the
/// reason in `error`, when no plot could be made; the caller reports it, nothing crashes.
/// The four written plans and the baselines' fastest and least-energy points are marked and
/// labelled.
bool plot_frontiers(const WorkloadEvaluation& e, const std::string& png_path, std::string& error);

/// Draws DIR/SUBDIR/NAME.timeline.png for each written plan, Megatron-LM's plan in a second
/// panel (timeline.h), creating SUBDIR. Returns plan name -> path relative to DIR of each
/// picture made; when one fails, `error` says why and the others are still drawn.
std::map<std::string, std::string> plot_plan_timelines(const WorkloadEvaluation& e,
                                                       const std::string& dir,
                                                       const std::string& subdir,
                                                       std::string& error);

}  // namespace kareus
