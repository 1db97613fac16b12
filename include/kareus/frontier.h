// Iteration-level planning: the DAG of pipeline instructions and the time-energy frontier.
//
// The solver is the Phillips-Dessouky time-cost trade-off algorithm (Phillips & Dessouky,
// "Solving the project time/cost tradeoff problem using the minimal cut concept", Management
// Science 1977), as used by Perseus (Chung et al., SOSP '24; the lowtime library). See
// src/frontier/phillips_dessouky.cc for where it is exact and where it is a heuristic.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kareus/kernel_graph.h"

namespace kareus {

struct DagOption {
  double time_s = 0;
  double energy_j = 0;  ///< dynamic energy, summed over the stage's GPUs
};

/// What a DAG node stands for: a pipeline instruction, a message between stages or a
/// once-per-iteration reduction.
/// kDataParallel: a data-parallel collective that overlaps the pipeline (the gradient
/// reduction's cost on top of a chunk's last backward, or a parameter all-gather).
enum class DagNodeKind { kForward, kBackward, kP2p, kIteration, kDataParallel };
/// "forward", "backward", "p2p", "iteration", "dp"
const char* to_string(DagNodeKind k);
DagNodeKind dag_node_kind(InstructionKind k);

struct DagNode {
  int id = 0;
  int stage = 0;
  DagNodeKind instruction = DagNodeKind::kForward;
  int microbatch = -1;
  /// The instruction's options: a Pareto set on (time, energy), time ascending, possibly
  /// followed by options kept at their own clock (keep_clock_options in planner.cc); the solver
  /// sorts what it needs, nothing may assume the order.
  std::vector<DagOption> options;
  int chunk = 0;  ///< model chunk of an instruction under an interleaved schedule
};

struct IterationDag {
  std::vector<DagNode> nodes;
  std::vector<std::pair<int, int>> edges;  ///< (from, to): `to` starts after `from` ends
  double static_power_w = 0;
  int gpus = 0;  ///< whole job

  /// Longest path (seconds) when node i runs option choice[i].
  double makespan_s(const std::vector<int>& choice) const;
  /// Total energy of a choice: dynamic energies + gpus x static power x makespan.
  double energy_j(const std::vector<int>& choice) const;
  /// Topological order of node ids (throws InternalError on a cycle).
  std::vector<int> topological_order() const;
};

struct FrontierPoint {
  double time_s = 0;
  double energy_j = 0;  ///< total: dynamic + static
  double dynamic_energy_j = 0;
  std::vector<int> choice;  ///< option index per node
};

struct FrontierOptions {
  double unit_s = 1e-3;  ///< time quantum of the solver
  /// Called as the solver advances with (steps done, bound on the steps); may be empty.
  std::function<void(std::size_t, std::size_t)> progress;
  /// Start each iteration's maximum flow from the previous one's and reuse the previous cut
  /// when the critical network did not change. Off: every cut from scratch (the same frontier,
  /// slower; for tests).
  bool warm_start = true;
};

struct FrontierStats {
  int iterations = 0;
  int cuts_without_credit = 0;  ///< cuts taken with lb = 0 because the bounds were infeasible
  double seconds = 0;
  double cpu_seconds = 0;  ///< CPU time of the solving thread (wall time minus waiting)
};

/// Keeps the Pareto set on (time_s, energy_j), fastest first.
std::vector<FrontierPoint> pareto_frontier(const std::vector<FrontierPoint>& points);

/// Relative iteration-time difference below which two plans count as equally fast: the time
/// noise of one measurement (0.1%, an H200's repeatability, docs/emulator.md). Under the power
/// cap the top clocks run at about the same effective clock, so plans at 1980 and 1800 MHz
/// differ in time by noise while one costs 0.5% more energy: a "fastest" plan picked by time
/// alone turns that noise into a costlier plan, and a baseline's costlier "fastest" plan
/// inflates every saving measured against it.
inline constexpr double kTimeTieRel = 1e-3;

/// The max-throughput point of `points` (time(p), energy(p) give its iteration time and
/// energy): the least-energy point among those within kTimeTieRel of the fastest time. The one
/// rule for `plan --max-throughput`, the evaluation's fastest plans and its iso-time reference.
template <typename P, typename TimeFn, typename EnergyFn>
std::size_t max_throughput_index(const std::vector<P>& points, TimeFn time, EnergyFn energy) {
  std::size_t fastest = 0;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (time(points[i]) < time(points[fastest])) fastest = i;
  }
  std::size_t best = fastest;
  const double bound = time(points[fastest]) * (1 + kTimeTieRel);
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (time(points[i]) <= bound && energy(points[i]) < energy(points[best])) best = i;
  }
  return best;
}

/// The Pareto frontier on (iteration time, total energy), fastest first. Every point is
/// evaluated on the discrete options it chose.
std::vector<FrontierPoint> solve_frontier(const IterationDag& dag, const FrontierOptions& o = {},
                                          FrontierStats* stats = nullptr);

}  // namespace kareus
