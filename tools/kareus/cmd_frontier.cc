// `kareus frontier FILE ... --json`: the iteration time-energy frontier with a plan per point.
// `kareus plan FILE (--deadline S | --energy-budget J | --max-throughput | --min-energy)
//  --out PLAN.json`: the plan that meets a goal.
// `kareus plan show PLAN [--workload FILE] [--json]`: a plan's summary (validated against the
//  workload when one is given).
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kareus/error.h"
#include "kareus/table.h"
#include "planner_flags.h"

namespace kareus::cli {

void register_frontier(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("frontier", "Compute the iteration time-energy frontier");
  static std::string file, dump_dag, method = "kareus";
  static bool json = false;
  static PlannerFlags flags;
  cmd->add_option("FILE", file, "workload YAML file")->required();
  cmd->add_option("--method", method,
                  "kareus, kareus_max_clock, nanobatch_perseus, nanobatch, perseus, megatron")
      ->capture_default_str();
  cmd->add_option("--dump-dag", dump_dag, "write the solver's DAG (JSON) to this file");
  cmd->add_flag("--json", json, "machine-readable output");
  add_planner_flags(cmd, flags);
  cmd->callback([&action] {
    action = [] {
      const Method m = method_from_string(method);
      const Workload w = load_workload(file);
      ProfilingSession session = open_profiling(flags.profiling, w);
      PipelineProgress progress(!flags.quiet);
      Planner planner(w, *session.cached, flags.planner, progress.callback());
      const MethodFrontier f = planner.frontier(m);
      progress.finish();
      if (!dump_dag.empty()) {
        std::ofstream out(dump_dag);
        if (!out) throw InvalidInput(fmt::format("--dump-dag {}: cannot write", dump_dag));
        out << dag_to_json(f.dag).dump(1) << "\n";
      }
      if (json) {
        nlohmann::json j;
        j["workload"] = w.name;
        j["method"] = to_string(m);
        j["measured"] = planner.measurements();
        j["reused"] = planner.reused();
        j["solver"] = {{"iterations", f.stats.iterations}, {"seconds", f.stats.seconds}};
        j["clock_switch_s"] = f.clock_switch_s;
        j["min_clock_hold_s"] = f.min_clock_hold_s;
        j["points"] = nlohmann::json::array();
        for (std::size_t i = 0; i < f.points.size(); ++i) {
          const Plan p = planner.make_plan(f, i, "frontier point");
          j["points"].push_back({{"iteration_time_s", f.points[i].time_s},
                                 {"energy_j", f.points[i].energy_j},
                                 {"clock_changes", p.clock_changes()},
                                 {"plan", p.to_json()}});
        }
        // The solver's frontier with free clock changes, for comparison.
        j["points_without_switch_cost"] = nlohmann::json::array();
        for (const auto& p : f.points_without_switch_cost) {
          j["points_without_switch_cost"].push_back(
              {{"iteration_time_s", p.time_s}, {"energy_j", p.energy_j}});
        }
        std::cout << j.dump(1) << "\n";
        return 0;
      }
      std::cout << fmt::format(
          "{} frontier of {}: {} points ({} solver iterations, {:.3f} s); "
          "{} measurements, {} from the store; clock switch {:.1f} ms, hold >= {:.1f} ms\n",
          to_string(m), w.name, f.points.size(), f.stats.iterations, f.stats.seconds,
          planner.measurements(), planner.reused(), f.clock_switch_s * 1e3,
          f.min_clock_hold_s * 1e3);
      TextTable t({"iteration time (s)", "energy (J, whole job)", "avg power per GPU (W)",
                   "clock changes"});
      for (std::size_t i = 0; i < f.points.size(); ++i) {
        const auto& p = f.points[i];
        const ClockSchedule sch = schedule_with_switches(f, p.choice, f.clock_switch_s);
        int changes = 0;
        for (int c : sch.clock_changes) changes += c;
        t.add_row({fmt::format("{:.4f}", p.time_s), fmt::format("{:.1f}", p.energy_j),
                   fmt::format("{:.1f}", p.energy_j / p.time_s / w.cluster.gpus()),
                   std::to_string(changes)});
      }
      std::cout << t.render();
      return 0;
    };
  });
}

void register_plan(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("plan", "Write the plan that meets a goal");
  static std::string file, out, method = "kareus";
  static double deadline = 0, budget_j = 0;
  static bool max_tp = false, min_e = false, json = false;
  static PlannerFlags flags;
  // Not ->required(): `kareus plan show PLAN` has no workload positional; checked below.
  cmd->add_option("FILE", file, "workload YAML file");
  auto* show = cmd->add_subcommand("show", "Summarize a plan file (clocks, SMs, slots, ranks)");
  static std::string show_file, show_workload;
  static bool show_json = false;
  show->add_option("PLAN", show_file, "plan JSON file")->required();
  show->add_option("--workload", show_workload, "validate the plan against this workload");
  show->add_flag("--json", show_json, "machine-readable summary");
  show->callback([&action] {
    action = [] {
      const Plan p = show_workload.empty() ? load_plan(show_file)
                                           : load_plan(show_file, load_workload(show_workload));
      std::cout << (show_json ? plan_summary_json(p).dump(2) + "\n" : plan_summary_text(p));
      return 0;
    };
  });
  auto* g1 = cmd->add_option("--deadline", deadline, "least energy with iteration time <= S");
  auto* g2 = cmd->add_option("--energy-budget", budget_j, "fastest with energy (J/iteration) <= J");
  auto* g3 = cmd->add_flag("--max-throughput", max_tp, "fastest plan");
  auto* g4 = cmd->add_flag("--min-energy", min_e, "least-energy plan");
  g1->excludes(g2)->excludes(g3)->excludes(g4);
  g2->excludes(g3)->excludes(g4);
  g3->excludes(g4);
  cmd->add_option("--out", out, "plan file to write (required)");
  cmd->add_option("--method", method, "planning method (see `kareus frontier --help`)")
      ->capture_default_str();
  cmd->add_flag("--json", json, "print the plan's summary as JSON");
  add_planner_flags(cmd, flags);
  cmd->callback([&action, show, g1, g2, g3, g4] {
    if (show->parsed()) return;  // `plan show` set the action
    action = [g1, g2, g3, g4] {
      if (file.empty())
        throw InvalidInput("plan needs a workload FILE (or: kareus plan show PLAN)");
      if (out.empty()) throw InvalidInput("plan needs --out PLAN.json");
      Goal goal;
      if (g1->count()) {
        goal = {GoalKind::kDeadline, deadline};
      } else if (g2->count()) {
        goal = {GoalKind::kEnergyBudget, budget_j};
      } else if (g3->count()) {
        goal = {GoalKind::kMaxThroughput, 0};
      } else if (g4->count()) {
        goal = {GoalKind::kMinEnergy, 0};
      } else {
        throw InvalidInput(
            "plan needs a goal: --deadline S, --energy-budget J, --max-throughput or --min-energy");
      }
      const Workload w = load_workload(file);
      ProfilingSession session = open_profiling(flags.profiling, w);
      PipelineProgress progress(!flags.quiet);
      Planner planner(w, *session.cached, flags.planner, progress.callback());
      const MethodFrontier f = planner.frontier(method_from_string(method));
      progress.finish();
      const auto idx = select_point(f.points, goal);
      if (!idx) {
        double tmin = 1e300, tmax = 0, emin = 1e300, emax = 0;
        for (const auto& p : f.points) {
          tmin = std::min(tmin, p.time_s);
          tmax = std::max(tmax, p.time_s);
          emin = std::min(emin, p.energy_j);
          emax = std::max(emax, p.energy_j);
        }
        throw InvalidInput(fmt::format(
            "{} is infeasible: the frontier spans iteration times {:.4f}..{:.4f} s and energies "
            "{:.1f}..{:.1f} J",
            goal.kind == GoalKind::kDeadline ? fmt::format("--deadline {}", deadline)
                                             : fmt::format("--energy-budget {}", budget_j),
            tmin, tmax, emin, emax));
      }
      const Plan p = planner.make_plan(f, *idx, goal.describe());
      save_plan(p, out);
      if (json) {
        std::cout << nlohmann::json({{"plan", out},
                                     {"goal", p.goal},
                                     {"iteration_time_s", p.iteration_time_s},
                                     {"energy_j", p.energy_j},
                                     {"clock_changes", p.clock_changes()}})
                         .dump(2)
                  << "\n";
      } else {
        std::cout << fmt::format(
            "{}: {} -> {:.4f} s, {:.1f} J per iteration (whole job), {} clock changes\n", out,
            p.goal, p.iteration_time_s, p.energy_j, p.clock_changes());
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
