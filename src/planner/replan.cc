// Re-planning around stragglers (include/kareus/replan.h).
//
// Perseus (Chung et al., "Reducing Energy Bloat in Large Model Training", SOSP '24, section 4.3)
// observes that a stage slowed by a straggler becomes the pipeline's critical path, so the other
// stages gain slack and may run slower at no cost in iteration time. Its released code never
// plans for it. Here the stored frontier is the starting point: every stored point is
// re-evaluated on the iteration DAG with the slowed stage's instruction times stretched, the
// goal picks one, and a greedy slack reclaim then moves instructions off the critical path to
// cheaper options one step at a time, each step checked on the full schedule (clock-switch
// stalls included) and kept only when the makespan stays within the goal's time and the whole
// job's energy (dynamic plus static over the makespan) drops.
//
// Why not solve the frontier again: the solver's whole frontier takes 1.3 s of CPU on a 64-GPU
// PP8 x 32 DAG (docs/benchmarks.md), which is longer than one of that job's iterations, while a
// re-plan must land within an iteration. The reclaim is a heuristic (it can stop in a local
// optimum); bench/replan_bench.cc compares it with a fresh solve on the slowed DAG.
#include "kareus/replan.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "kareus/error.h"

namespace kareus {

std::vector<double> parse_stage_slowdowns(const std::vector<std::string>& specs, int stages,
                                          const std::string& option) {
  std::vector<double> factor(static_cast<std::size_t>(std::max(stages, 0)), 1.0);
  std::vector<bool> named(factor.size(), false);
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    auto bad = [&](const std::string& why) {
      throw InvalidInput(
          fmt::format("{} '{}': {}; expected STAGE=FACTOR with STAGE in 0..{} and FACTOR in "
                      "[1, 100] (e.g. 1=1.1: stage 1's instructions take 10% longer)",
                      option, spec, why, stages - 1));
    };
    if (eq == std::string::npos) bad("no '='");
    int stage = -1;
    double f = 0;
    try {
      std::size_t used = 0;
      stage = std::stoi(spec.substr(0, eq), &used);
      if (used != eq) bad("the stage is not an integer");
      const std::string fs = spec.substr(eq + 1);
      f = std::stod(fs, &used);
      if (used != fs.size()) bad("the factor is not a number");
    } catch (const std::logic_error&) {
      bad("not a number");
    }
    if (stage < 0 || stage >= stages) bad(fmt::format("no stage {}", stage));
    if (!std::isfinite(f) || f < 1 || f > 100) bad(fmt::format("factor {} out of range", f));
    if (named[static_cast<std::size_t>(stage)]) bad(fmt::format("stage {} named twice", stage));
    named[static_cast<std::size_t>(stage)] = true;
    factor[static_cast<std::size_t>(stage)] = f;
  }
  return factor;
}

std::string describe_stage_slowdowns(const std::vector<double>& factor) {
  std::string out;
  for (std::size_t s = 0; s < factor.size(); ++s) {
    if (factor[s] == 1) continue;
    out += fmt::format("{}{}={:.3f}", out.empty() ? "" : ", ", s, factor[s]);
  }
  return out.empty() ? "none" : out;
}

MethodFrontier slowed_frontier(const Workload& w, const PartitionSet& ps, const MethodFrontier& f,
                               const std::vector<double>& factor) {
  const Schedule sched = w.schedule();
  if (factor.size() != static_cast<std::size_t>(sched.stages())) {
    throw InternalError("slowed_frontier: one factor per pipeline stage expected");
  }
  MethodFrontier out = f;
  for (std::size_t t = 0; t < out.tables.size(); ++t) {
    const double x = factor[static_cast<std::size_t>(sched.stage_of(static_cast<int>(t / 2)))];
    for (auto& o : out.tables[t]) o.time_s *= x;
  }
  build_iteration_dag(w, ps, out);
  return out;
}

namespace {

// Latest start of every node such that the makespan stays within `deadline_s`, with each
// node's duration as scheduled (stall included).
std::vector<double> latest_starts(const MethodFrontier& f, const DagTopology& t,
                                  const std::vector<std::vector<int>>& succs,
                                  const ClockSchedule& sch, double deadline_s) {
  std::vector<double> ls(f.dag.nodes.size(), deadline_s);
  for (auto it = t.order.rbegin(); it != t.order.rend(); ++it) {
    const auto v = static_cast<std::size_t>(*it);
    double lf = deadline_s;
    for (int u : succs[v]) lf = std::min(lf, ls[static_cast<std::size_t>(u)]);
    ls[v] = lf - (sch.end_s[v] - sch.start_s[v]);
  }
  return ls;
}

// The next cheaper option of node v: the fastest of those with less energy than the current
// one and no less time (the node's options need not be sorted, DagNode). -1: none.
int next_cheaper(const DagNode& n, int current) {
  const DagOption& c = n.options[static_cast<std::size_t>(current)];
  int best = -1;
  for (std::size_t j = 0; j < n.options.size(); ++j) {
    const DagOption& o = n.options[j];
    if (!(o.energy_j < c.energy_j) || o.time_s < c.time_s) continue;
    if (best < 0 || o.time_s < n.options[static_cast<std::size_t>(best)].time_s ||
        (o.time_s == n.options[static_cast<std::size_t>(best)].time_s &&
         o.energy_j < n.options[static_cast<std::size_t>(best)].energy_j)) {
      best = static_cast<int>(j);
    }
  }
  return best;
}

// For a run of equal clocks on a stage (nodes[b, e) of the stage's instructions): the next lower
// clock every node of the run has an option at, each node taking its fastest option there.
// Empty when there is none. A clock change stalls the stage (clock_switch_s, 15 ms on today's
// GPUs, longer than many instructions), so lowering one instruction at a time rarely pays; the
// whole run moves without adding a switch.
std::vector<int> lower_run(const MethodFrontier& f, const std::vector<int>& nodes, std::size_t b,
                           std::size_t e, int freq_mhz) {
  // The highest clock of the run's first node below `mhz`; 0: none.
  const auto& first = f.node_options(static_cast<std::size_t>(nodes[b]));
  auto clock_below = [&first](int mhz) {
    int below = 0;
    for (const auto& o : first) {
      if (o.freq_mhz < mhz && o.freq_mhz > below) below = o.freq_mhz;
    }
    return below;
  };
  std::vector<int> picks;
  for (int target = clock_below(freq_mhz); target > 0; target = clock_below(target)) {
    picks.clear();
    for (std::size_t k = b; k < e; ++k) {
      const auto v = static_cast<std::size_t>(nodes[k]);
      const auto& opts = f.node_options(v);
      int best = -1;
      for (std::size_t j = 0; j < opts.size(); ++j) {
        if (opts[j].freq_mhz != target) continue;
        if (best < 0 || f.dag.nodes[v].options[j].time_s <
                            f.dag.nodes[v].options[static_cast<std::size_t>(best)].time_s) {
          best = static_cast<int>(j);
        }
      }
      if (best < 0) break;
      picks.push_back(best);
    }
    if (picks.size() == e - b) return picks;  // else some node lacks it: the next lower clock
  }
  return {};
}

}  // namespace

std::vector<int> reclaim_slack(const MethodFrontier& f, const DagTopology& t,
                               std::vector<int> choice, double deadline_s, int max_passes,
                               int* moves) {
  const std::size_t n = f.dag.nodes.size();
  std::vector<std::vector<int>> succs(n);
  for (const auto& [a, b] : f.dag.edges) succs[static_cast<std::size_t>(a)].push_back(b);
  // A step must keep the makespan within the deadline up to rounding of the sums.
  const double bound_s = deadline_s * (1 + 1e-12);
  ClockSchedule sch = schedule_with_switches(f, t, choice, f.clock_switch_s);
  if (sch.makespan_s > bound_s) return choice;  // no slack to reclaim
  std::vector<double> ls = latest_starts(f, t, succs, sch, deadline_s);
  int accepted = 0;
  for (int pass = 0; pass < max_passes; ++pass) {
    bool changed = false;
    for (const int v : t.order) {
      const auto vi = static_cast<std::size_t>(v);
      if (f.node_options(vi).empty()) continue;  // messages and reductions have one option
      const DagNode& node = f.dag.nodes[vi];
      const int cur = choice[vi];
      const int next = next_cheaper(node, cur);
      if (next < 0) continue;
      const double grow_s = node.options[static_cast<std::size_t>(next)].time_s -
                            node.options[static_cast<std::size_t>(cur)].time_s;
      // The float ignores the clock switches the step may add or remove (its own and the next
      // instruction's stall), so it admits up to two stalls more; the full schedule decides.
      if (grow_s > ls[vi] - sch.start_s[vi] + 2 * f.clock_switch_s + 1e-12 * deadline_s) continue;
      choice[vi] = next;
      ClockSchedule trial = schedule_with_switches(f, t, choice, f.clock_switch_s);
      if (trial.makespan_s <= bound_s && trial.energy_j < sch.energy_j) {
        sch = std::move(trial);
        ls = latest_starts(f, t, succs, sch, deadline_s);
        ++accepted;
        changed = true;
      } else {
        choice[vi] = cur;
      }
    }
    // Whole runs of one clock, one clock step lower each.
    for (const auto& nodes : t.stages) {
      std::size_t b = 0;
      while (b < nodes.size()) {
        const int freq = f.node_options(static_cast<std::size_t>(
            nodes[b]))[static_cast<std::size_t>(choice[static_cast<std::size_t>(nodes[b])])]
                             .freq_mhz;
        std::size_t e = b + 1;
        while (e < nodes.size() &&
               f.node_options(static_cast<std::size_t>(
                   nodes[e]))[static_cast<std::size_t>(choice[static_cast<std::size_t>(nodes[e])])]
                       .freq_mhz == freq) {
          ++e;
        }
        // The whole run, else its interior: a stage's first and last instructions are often on
        // the critical path (the pipeline's fill and drain) while the middle waits.
        for (const auto& [lo, hi] : {std::pair{b, e}, std::pair{b + 1, e - 1}}) {
          if (lo >= hi || (lo != b && e - b < 3)) continue;
          const std::vector<int> picks = lower_run(f, nodes, lo, hi, freq);
          if (picks.empty()) continue;
          std::vector<int> trial_choice = choice;
          for (std::size_t k = lo; k < hi; ++k) {
            trial_choice[static_cast<std::size_t>(nodes[k])] = picks[k - lo];
          }
          ClockSchedule trial = schedule_with_switches(f, t, trial_choice, f.clock_switch_s);
          if (trial.makespan_s <= bound_s && trial.energy_j < sch.energy_j) {
            choice = std::move(trial_choice);
            sch = std::move(trial);
            ls = latest_starts(f, t, succs, sch, deadline_s);
            accepted += static_cast<int>(hi - lo);
            changed = true;
            break;
          }
        }
        b = e;
      }
    }
    if (!changed) break;
  }
  if (moves != nullptr) *moves = accepted;
  return choice;
}

ReplanResult replan(const std::map<Method, MethodFrontier>& slowed,
                    const std::vector<FrontierRef>& refs, const Goal& goal,
                    const ReplanOptions& o) {
  if (refs.empty()) throw InvalidInput("re-plan: the frontier has no points");
  std::map<Method, DagTopology> topo;
  for (const auto& r : refs) {
    if (!topo.count(r.method)) topo.emplace(r.method, DagTopology(slowed.at(r.method)));
  }
  // Every stored point under the slowdown.
  std::vector<FrontierPoint> pts;
  pts.reserve(refs.size());
  for (const auto& r : refs) {
    const MethodFrontier& f = slowed.at(r.method);
    const std::vector<int>& c = f.points.at(r.index).choice;
    const ClockSchedule sch = schedule_with_switches(f, topo.at(r.method), c, f.clock_switch_s);
    pts.push_back({sch.makespan_s, sch.energy_j, sch.dynamic_energy_j, c});
  }
  auto improve = [&](std::size_t i, double within_s) {
    const FrontierRef& r = refs[i];
    const MethodFrontier& f = slowed.at(r.method);
    ReplanResult res;
    res.from = r;
    res.start_time_s = pts[i].time_s;
    res.start_energy_j = pts[i].energy_j;
    res.choice =
        reclaim_slack(f, topo.at(r.method), pts[i].choice, within_s, o.max_passes, &res.moves);
    const ClockSchedule sch =
        schedule_with_switches(f, topo.at(r.method), res.choice, f.clock_switch_s);
    res.time_s = sch.makespan_s;
    res.energy_j = sch.energy_j;
    return res;
  };
  const auto picked = select_point(pts, goal);
  if (goal.kind == GoalKind::kDeadline && picked) {
    // The reclaim may reorder the cheapest points that meet the deadline: improve a few.
    std::vector<std::size_t> meet;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      if (pts[i].time_s <= goal.value) meet.push_back(i);
    }
    std::stable_sort(meet.begin(), meet.end(), [&](std::size_t a, std::size_t b) {
      return pts[a].energy_j < pts[b].energy_j;
    });
    meet.resize(std::min(meet.size(), std::max<std::size_t>(o.candidates, 1)));
    ReplanResult best = improve(meet.front(), goal.value);
    for (std::size_t k = 1; k < meet.size(); ++k) {
      ReplanResult r = improve(meet[k], goal.value);
      if (r.energy_j < best.energy_j) best = std::move(r);
    }
    return best;
  }
  if (picked) return improve(*picked, pts[*picked].time_s);
  // Infeasible under the slowdown: the fastest plan, its slack reclaimed at its own time.
  const std::size_t fastest = max_throughput_index(
      pts, [](const FrontierPoint& p) { return p.time_s; },
      [](const FrontierPoint& p) { return p.energy_j; });
  ReplanResult res = improve(fastest, pts[fastest].time_s);
  res.goal_met = false;
  res.note = fmt::format(
      "{} cannot be met under the slowdown: the fastest plan takes {:.4f} s "
      "per iteration; running it",
      goal.describe(), res.time_s);
  return res;
}

Replanned replan_frontier(const FrontierFile& ff, const std::vector<FrontierRef>& refs,
                          const std::vector<double>& factor, const Goal& goal,
                          const ReplanOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::map<Method, MethodFrontier> slowed;
  for (const auto& r : refs) {
    if (!slowed.count(r.method)) {
      slowed.emplace(r.method,
                     slowed_frontier(ff.workload, ff.partitions, ff.method(r.method), factor));
    }
  }
  Replanned out;
  out.result = replan(slowed, refs, goal, o);
  std::string label = goal.describe();
  if (!out.result.goal_met) label += " (not met under the slowdown: fastest plan)";
  out.plan = materialize_plan(ff.workload, ff.partitions, ff.digest,
                              slowed.at(out.result.from.method), out.result.choice, label);
  out.plan.stage_slowdown = factor;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kareus
