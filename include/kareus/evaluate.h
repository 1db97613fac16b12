// End-to-end evaluation of one workload, as in the paper's evaluation (Wu, Chung, Chowdhury, OSDI
// '26): Kareus against Megatron-LM, Perseus, Nanobatching and Nanobatching + Perseus, and two
// ablations, every method through the same composition and frontier solver on the same
// measurements. Two Kareus frontiers are reported: its own (kareus_only) and the one a user
// gets, merged with Perseus's and Nanobatching+Perseus's plans where those are better (kareus);
// every merged point that is a baseline's plan is labelled so ("Kareus (Perseus plan)"), and
// own_losses records where Kareus's own frontier loses to each baseline.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kareus/frontier_file.h"
#include "kareus/metrics.h"
#include "kareus/planner.h"
#include "kareus/profiling_cost.h"

namespace kareus {

struct FrontierSummaryPoint {
  double iteration_time_s = 0;
  double energy_j = 0;
  std::string method;  ///< which method's plan (for Kareus's merged frontier)
};

/// The label of a Kareus operating point whose plan comes from `method` (to_string(Method)):
/// "Kareus" for its own plans, "Kareus (Perseus plan)" or "Kareus (Nanobatching+Perseus plan)"
/// where it fell back to a baseline's.
std::string kareus_plan_label(const std::string& method);

/// A frontier's max-throughput point (max_throughput_index in frontier.h: the least energy
/// within kTimeTieRel of the fastest time). Throws InternalError for an empty frontier.
const FrontierSummaryPoint& max_throughput_point(const std::vector<FrontierSummaryPoint>& v);

/// Where Kareus's own frontier loses to a baseline. Both are compared at every deadline both can
/// meet: each point time of either frontier from the later of the two fastest times on (above a
/// frontier's slowest point, its best is its least-energy point). A deadline is lost when the
/// best own energy within it exceeds the baseline's by more than 1e-9 relative.
struct FrontierLoss {
  std::string baseline;         ///< method name, e.g. "perseus"
  int deadlines = 0;            ///< deadlines compared
  int lost = 0;                 ///< of those, where Kareus's own frontier needs more energy
  double worst_excess_pct = 0;  ///< largest energy excess over the baseline (%), 0 if none lost
  double from_s = 0, to_s = 0;  ///< the first and last lost deadline (0 if none)
};
/// Compares `own` with `baseline` (points as in WorkloadEvaluation) as FrontierLoss describes.
FrontierLoss frontier_loss(const std::vector<FrontierSummaryPoint>& own,
                           const std::vector<FrontierSummaryPoint>& baseline,
                           const std::string& baseline_name);

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
  /// Plan-directed profiling (PlannerOptions::focus_rounds): the clocks the searches were
  /// focused on, from the plans of the rounds before the last; empty without.
  std::vector<int> focus_clocks_mhz;
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
  /// Kareus's own frontier against Perseus and Nanobatching+Perseus (in that order).
  std::vector<FrontierLoss> own_losses;
  /// Kareus's own iso-time point (least energy no slower than Perseus's fastest), if its
  /// frontier has one, and its saving against Perseus's fastest (%).
  bool own_has_iso_time = false;
  FrontierSummaryPoint own_iso_time_point;
  double own_iso_time_energy_saving_pct = 0;
  /// Set when Kareus's own slowest plan is faster than Perseus's fastest: iso-time then
  /// compares plans of different speeds, and the report says so next to the iso-time figure.
  std::string iso_time_note;
  /// Other things a reader must know, one sentence each (e.g. overlap needs micro-batch >= 2).
  std::vector<std::string> notes;
  // The workload's GPU power model (GpuSpec::power_calibrated, power_source, power_caveat()).
  bool power_calibrated = false;
  std::string power_source;
  std::string power_caveat;
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

/// Fills e.own_losses, the own iso-time point and e.iso_time_note from e.kareus_only, e.perseus
/// and e.nanobatch_perseus (each non-empty, fastest first): Kareus's own frontier without the
/// fallback, against the baselines.
void compare_own_frontier(WorkloadEvaluation& e);

/// {"calibrated": bool, "source": "..."}: the "power_model" field of every --json output and
/// file that shows emulated energy.
nlohmann::json power_model_json(const GpuSpec& gpu);

/// Kareus's frontier as a user gets it, the one rule `kareus optimize`, `eval` and `kareus plan`
/// share: the Pareto set of Kareus's own points and of Perseus's and Nanobatching+Perseus's
/// (where a baseline's plan is better, Kareus falls back to it), as references into `f`
/// (which must hold those three methods), in the order pareto_front returns them.
std::vector<FrontierRef> merge_with_fallbacks(const std::map<Method, MethodFrontier>& f);

/// Runs the whole pipeline and every baseline for one workload.
/// With `screen`, the partition searches screen through it (Planner, PlannerOptions::screening)
/// and the profiling cost counts both windows.
WorkloadEvaluation evaluate_workload(const Workload& w, CachedProfiler& profiler,
                                     const PlannerOptions& o, const PlannerProgress& progress = {},
                                     bool collect_frontier_plans = false,
                                     CachedProfiler* screen = nullptr);

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
