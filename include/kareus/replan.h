// Re-planning around stragglers: when a pipeline stage runs slower than planned (a throttled GPU,
// a slow node), the stored frontier is re-read under that slowdown and the cheapest plan that
// still meets the goal is chosen, without profiling or solving again (src/planner/replan.cc).
//
// Thread-safety: plain functions over value types.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kareus/frontier_file.h"
#include "kareus/planner.h"

namespace kareus {

/// Per-stage time factors from "STAGE=FACTOR" specs (`--stage-slowdown 3=1.1`; a stage not
/// named keeps 1). InvalidInput naming `option` unless STAGE is in [0, stages), FACTOR is finite
/// and in [1, 100] (a re-plan is for stages that run slower than planned) and no stage is named
/// twice.
std::vector<double> parse_stage_slowdowns(const std::vector<std::string>& specs, int stages,
                                          const std::string& option);
/// "1=1.100, 3=1.050" for the stages whose factor is not 1; "none" when there is none.
std::string describe_stage_slowdowns(const std::vector<double>& factor);

/// `f` with every instruction of stage s taking factor[s] times as long at the same dynamic
/// energy, DAG rebuilt (the emulator's straggler model, emulate_iteration with
/// stage_time_factor). Messages and reductions keep their times. The stored points keep their
/// choices; their time and energy are re-evaluated on the slowed DAG.
MethodFrontier slowed_frontier(const Workload& w, const PartitionSet& ps, const MethodFrontier& f,
                               const std::vector<double>& factor);

struct ReplanOptions {
  /// Slack reclaim passes at most (each moves every instruction at most one option cheaper).
  int max_passes = 64;
  /// For a deadline goal: how many of the cheapest stored points that meet it are improved by
  /// the reclaim (the cheapest before the reclaim need not be the cheapest after it).
  std::size_t candidates = 4;
};

struct ReplanResult {
  FrontierRef from;         ///< the stored point the plan starts from
  std::vector<int> choice;  ///< per DAG node of the slowed frontier of from.method
  double time_s = 0;        ///< predicted under the slowdown, clock-switch stalls included
  double energy_j = 0;      ///< whole job, one iteration
  double start_time_s = 0;  ///< the stored point under the slowdown, before the reclaim
  double start_energy_j = 0;
  int moves = 0;         ///< instructions the reclaim moved to a cheaper option
  bool goal_met = true;  ///< false: the goal cannot be met under the slowdown
  std::string note;      ///< why the goal was not met, and what was taken instead
};

/// Moves instructions to cheaper (slower) options where the schedule has slack, as long as the
/// makespan stays within `deadline_s` and the whole job's energy drops: the energy Perseus
/// (Chung et al., SOSP '24, section 4.3) reclaims from stages that wait for a straggler. Greedy,
/// one option step per instruction per pass, then each run of one clock on a stage one clock
/// lower as a whole (one instruction alone would add clock-switch stalls, 15 ms on today's GPUs);
/// each step checked on the full schedule with clock switches. `moves` counts instructions
/// moved.
std::vector<int> reclaim_slack(const MethodFrontier& f, const DagTopology& t,
                               std::vector<int> choice, double deadline_s, int max_passes,
                               int* moves = nullptr);

/// The plan for `goal` among `refs` on the slowed frontiers: each stored point is re-evaluated
/// under the slowdown, the goal picks one (select_point), then reclaim_slack lowers its energy
/// within the goal's time (the deadline; otherwise the chosen point's own time, so the
/// throughput, an energy budget or a power cap still holds). A deadline the slowed frontier
/// cannot meet takes the fastest plan (goal_met false, `note` says so).
ReplanResult replan(const std::map<Method, MethodFrontier>& slowed,
                    const std::vector<FrontierRef>& refs, const Goal& goal,
                    const ReplanOptions& o = {});

/// A re-planned frontier file: the slowed frontiers, the result and its plan (stage_slowdown
/// recorded in the plan).
struct Replanned {
  ReplanResult result;
  Plan plan;
  double seconds = 0;  ///< wall time of slowing, choosing and materializing
};
Replanned replan_frontier(const FrontierFile& ff, const std::vector<FrontierRef>& refs,
                          const std::vector<double>& factor, const Goal& goal,
                          const ReplanOptions& o = {});

}  // namespace kareus
