// Re-planning around a straggler (include/kareus/replan.h): how long a re-plan takes on a stored
// frontier, and how its energy compares with keeping the old plan stretched.
//
//   replan_bench FRONTIER.json [--factor 1.1]
//
// For every stage in turn slowed by --factor: the max-throughput re-plan and a deadline re-plan
// (deadline: the stored fastest point's time x 1.2), wall time of the re-plan (slowing the DAG,
// choosing, reclaiming, materializing), the energy of the stretched old plan (the goal's stored
// point kept) and of the re-plan, both predicted under the slowdown. Loading is timed once.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "kareus/frontier_file.h"
#include "kareus/replan.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kareus;
  if (argc < 2) {
    std::cerr << "usage: replan_bench FRONTIER.json [--factor 1.1]\n";
    return 2;
  }
  double factor_x = 1.1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--factor" && i + 1 < argc) {
      factor_x = std::atof(argv[++i]);
    } else {
      std::cerr << "replan_bench: unknown argument " << a << "\n";
      return 2;
    }
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    const FrontierFile ff = load_frontier_file(argv[1]);
    const double load_s = seconds_since(t0);
    const MethodFrontier& f = ff.method(Method::kKareus);
    std::vector<FrontierRef> refs;
    for (std::size_t i = 0; i < f.points.size(); ++i) refs.push_back({Method::kKareus, i});
    const int pp = ff.workload.parallel.pp;
    std::cout << fmt::format(
        "{}: {} GPUs, pp {}, {} DAG nodes, {} stored points; load {:.3f} s; factor {}\n\n",
        ff.workload.name, ff.workload.cluster.gpus(), pp, f.dag.nodes.size(), f.points.size(),
        load_s, factor_x);
    std::cout << "| stage | goal | re-plan wall (s) | stretched old plan (J) | re-plan (J) | "
                 "saving | time (s) old / new |"
              << "\n";
    std::cout << "|---|---|---:|---:|---:|---:|---:|\n";
    const DagTopology topo0(f);
    for (int s = 0; s < pp; ++s) {
      std::vector<double> factor(static_cast<std::size_t>(pp), 1.0);
      factor[static_cast<std::size_t>(s)] = factor_x;
      for (const Goal& g : {Goal{GoalKind::kMaxThroughput, 0},
                            Goal{GoalKind::kDeadline, f.points.front().time_s * 1.2}}) {
        t0 = std::chrono::steady_clock::now();
        const Replanned r = replan_frontier(ff, refs, factor, g);
        const double wall_s = seconds_since(t0);
        // The old plan: the goal's stored point, kept and stretched.
        const MethodFrontier slowed = slowed_frontier(ff.workload, ff.partitions, f, factor);
        const DagTopology topo(slowed);
        const auto old_idx = select_point(f.points, g);
        const ClockSchedule old_sch = schedule_with_switches(
            slowed, topo, f.points.at(*old_idx).choice, slowed.clock_switch_s);
        std::cout << fmt::format(
            "| {} | {} | {:.3f} | {:.1f} | {:.1f} | {:+.2f}% | {:.4f} / {:.4f} "
            "|\n",
            s, g.describe(), wall_s, old_sch.energy_j, r.result.energy_j,
            100 * (r.result.energy_j / old_sch.energy_j - 1), old_sch.makespan_s, r.result.time_s);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "replan_bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
