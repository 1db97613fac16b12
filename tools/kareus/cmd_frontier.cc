// `kareus frontier FILE [--json | --all]`: the iteration time-energy frontier, summarised in 10
//  rows, every point, or every point with its plan.
// `kareus plan FILE (--deadline S | --energy-budget J | --max-throughput | --min-energy |
//  --power-cap-w W | --job-power-cap-kw KW) --out PLAN.json`: the plan that meets a goal.
// `kareus plan show PLAN [--workload FILE] [--json] [--png FILE]`: a plan's summary and metrics
//  (validated against the workload when one is given), optionally its timeline picture.
#include <fmt/format.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/evaluate.h"
#include "kareus/frontier_file.h"
#include "kareus/metrics.h"
#include "kareus/replan.h"
#include "kareus/table.h"
#include "kareus/timeline.h"
#include "planner_flags.h"

namespace kareus::cli {
namespace {

/// `plan --deadline`'s default margin: the prediction must stay this fraction below the
/// deadline, a cushion for backends whose plans cannot be replayed here. With the emulator the
/// chosen plan is also replayed and must meet the deadline itself (predictions and replays
/// differ by up to a few percent on pipelines with long stalls; the eval report lists them).
constexpr double kDefaultDeadlineMargin = 0.005;

/// The flags of `kareus frontier`, owned by the subcommand's callback.
struct FrontierArgs {
  std::string file, dump_dag, method = "kareus";
  bool json = false, all = false;
  PlannerFlags flags;
};

/// The flags of `kareus plan` and `kareus plan show`.
struct PlanArgs {
  std::string file, out, method = "kareus", from;
  std::vector<std::string> stage_slowdown;  ///< STAGE=FACTOR: re-plan around stragglers
  double deadline = 0, budget_j = 0;
  double power_cap_w = 0, job_power_cap_kw = 0;
  double margin = kDefaultDeadlineMargin;
  bool max_tp = false, min_e = false, json = false;
  bool no_fallback = false;  ///< Kareus's own frontier only, never a baseline's plan
  PlannerFlags flags;
};
struct PlanShowArgs {
  std::string file, workload, png;
  bool json = false;
};

/// `plan show`'s metrics (metrics.h): all of them with the workload (tokens and model FLOPs
/// come from it), only the average power per GPU without.
nlohmann::json plan_show_metrics(const Plan& p, const Workload* w) {
  if (w != nullptr)
    return to_json(throughput_metrics(job_shape(*w), p.iteration_time_s, p.energy_j));
  return {{"avg_power_per_gpu_w", average_power_per_gpu_w(p.energy_j, p.iteration_time_s, p.gpus)}};
}
std::string plan_show_metrics_text(const Plan& p, const Workload* w) {
  if (w != nullptr) {
    return "metrics: " +
           metrics_line(throughput_metrics(job_shape(*w), p.iteration_time_s, p.energy_j)) + "\n";
  }
  return fmt::format(
      "metrics: {:.0f} W/GPU average; tokens/s, MFU and energy per token need --workload FILE\n",
      average_power_per_gpu_w(p.energy_j, p.iteration_time_s, p.gpus));
}

/// Bounds of the plan goals: a finite deadline up to about 11.6 days per iteration, an energy
/// budget up to a petajoule per iteration, a power cap up to 100 kW per GPU and 10 GW per job;
/// anything larger is a typo, not a goal.
constexpr double kMaxDeadlineS = 1e6;
constexpr double kMaxEnergyBudgetJ = 1e15;
constexpr double kMaxPowerCapW = 1e5;
constexpr double kMaxJobPowerCapKw = 1e7;

/// Rows `frontier` prints without --all.
constexpr std::size_t kSummaryRows = 10;

/// The indices of the points to print: all of them, or kSummaryRows evenly spaced ones from
/// the fastest to the least-energy point.
std::vector<std::size_t> shown_points(std::size_t n, bool all) {
  std::vector<std::size_t> idx;
  if (all || n <= kSummaryRows) {
    for (std::size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  for (std::size_t k = 0; k < kSummaryRows; ++k) {
    idx.push_back((k * (n - 1) + (kSummaryRows - 1) / 2) / (kSummaryRows - 1));
  }
  return idx;
}

/// The option a power-cap goal came from, for messages.
const char* power_cap_flag(const Goal& goal) {
  return goal.kind == GoalKind::kPowerCap ? "--power-cap-w" : "--job-power-cap-kw";
}

/// The plan command's line for a power cap: the cap per GPU, the prediction and the replay.
std::string power_cap_text(Goal goal, const Plan& p, int gpus) {
  goal.gpus = gpus;
  const double limit_w = goal.power_limit_per_gpu_w();
  return fmt::format(
      "{}: predicted {:.1f} W per GPU <= {:.1f} W{}\n",
      goal.kind == GoalKind::kPowerCap
          ? goal.describe()
          : fmt::format("{} ({:.1f} W per GPU over {} GPUs)", goal.describe(), limit_w, gpus),
      p.avg_power_per_gpu_w, limit_w,
      p.replayed_avg_power_per_gpu_w >= 0
          ? fmt::format("; emulator replay {:.1f} W per GPU <= {:.1f} W",
                        p.replayed_avg_power_per_gpu_w, limit_w)
          : std::string("; not replayed (backend is not the emulator)"));
}

/// The error for a power cap below every frontier point's average power: the lowest average
/// power per GPU any plan achieves (and the job's, for a job cap).
[[noreturn]] void throw_power_cap_infeasible(const Goal& goal,
                                             const std::vector<FrontierPoint>& points) {
  double pmin = 1e300, pmax = 0;
  for (const auto& p : points) {
    const double w = average_power_per_gpu_w(p.energy_j, p.time_s, goal.gpus);
    pmin = std::min(pmin, w);
    pmax = std::max(pmax, w);
  }
  if (goal.kind == GoalKind::kPowerCap) {
    throw InvalidInput(fmt::format(
        "--power-cap-w {}: infeasible: the lowest average power of any plan is {} W per GPU; "
        "allowed: >= {} W (the frontier spans {}..{} W per GPU)",
        num(goal.value), num(pmin), num(pmin), num(pmin), num(pmax)));
  }
  const double kw = 1e-3 * goal.gpus;
  throw InvalidInput(fmt::format(
      "--job-power-cap-kw {}: infeasible: the lowest average power of any plan is {} kW for the "
      "job ({} W per GPU x {} GPUs); allowed: >= {} kW (the frontier spans {}..{} kW)",
      num(goal.value), num(pmin * kw), num(pmin), goal.gpus, num(pmin * kw), num(pmin * kw),
      num(pmax * kw)));
}

/// The error for a goal no frontier point meets, with the range the frontier spans.
[[noreturn]] void throw_infeasible(const Goal& goal, const std::vector<FrontierPoint>& points,
                                   double deadline, double budget_j) {
  if (goal.power_cap()) throw_power_cap_infeasible(goal, points);
  double tmin = 1e300, tmax = 0, emin = 1e300, emax = 0;
  for (const auto& p : points) {
    tmin = std::min(tmin, p.time_s);
    tmax = std::max(tmax, p.time_s);
    emin = std::min(emin, p.energy_j);
    emax = std::max(emax, p.energy_j);
  }
  throw InvalidInput(
      goal.kind == GoalKind::kDeadline
          ? fmt::format("--deadline {}: infeasible: the fastest plan takes {} s per "
                        "iteration; allowed: >= {} s (the frontier spans {}..{} s)",
                        num(deadline), num(tmin), num(tmin), num(tmin), num(tmax))
          : fmt::format("--energy-budget {}: infeasible: the least-energy plan takes {} J "
                        "per iteration; allowed: >= {} J (the frontier spans {}..{} J)",
                        num(budget_j), num(emin), num(emin), num(emin), num(emax)));
}

/// The options `plan --from` takes; the others (planning, profiling) are the frontier file's.
bool used_with_from(const std::string& name) {
  for (const char* ok :
       {"FILE", "--deadline", "--energy-budget", "--max-throughput", "--min-energy",
        "--power-cap-w", "--job-power-cap-kw", "--out", "--method", "--json", "--quiet", "--from",
        "--help", "--margin", "--no-fallback", "--stage-slowdown"}) {
    if (name == ok) return true;
  }
  return false;
}

/// The points a plan may be chosen from: the method's frontier, or for Kareus the frontier
/// merged with Perseus's and Nanobatching+Perseus's plans where they are better (the rule of
/// `kareus optimize`, merge_with_fallbacks).
std::vector<FrontierRef> plan_candidates(const std::map<Method, MethodFrontier>& f, Method method,
                                         const std::vector<FrontierRef>& merged, bool no_fallback) {
  if (method == Method::kKareus && !no_fallback) return merged;
  std::vector<FrontierRef> refs;
  for (std::size_t i = 0; i < f.at(method).points.size(); ++i) refs.push_back({method, i});
  return refs;
}

/// Picks the plan for the goal among `refs`. A deadline goal takes the least-energy point whose
/// prediction keeps `margin` below the deadline and, with `replay`, whose emulator replay meets
/// the deadline too (else the next one by energy). A power cap takes the fastest point whose
/// predicted average power per GPU is within the cap and, with `replay`, whose replayed average
/// power is too (else the next one by time). `make` materializes a point as a plan.
Plan choose_plan(const std::map<Method, MethodFrontier>& f, const std::vector<FrontierRef>& refs,
                 const PlanArgs& a, const Goal& goal_without_gpus, const Workload& w, bool replay,
                 const std::function<Plan(const FrontierRef&, const std::string&)>& make) {
  Goal goal = goal_without_gpus;
  goal.gpus = w.cluster.gpus();
  std::vector<FrontierPoint> pts;
  pts.reserve(refs.size());
  for (const auto& r : refs) pts.push_back(f.at(r.method).points.at(r.index));
  auto labelled = [&](const FrontierRef& r) {
    Plan p = make(r, goal.describe());
    if (to_string(r.method) != std::string(to_string(Method::kKareus)) &&
        method_from_string(a.method) == Method::kKareus) {
      p.label = kareus_plan_label(to_string(r.method));
    }
    return p;
  };
  const bool deadline = goal.kind == GoalKind::kDeadline;
  if (!deadline && !goal.power_cap()) {
    const auto idx = select_point(pts, goal);
    if (!idx) throw_infeasible(goal, pts, a.deadline, a.budget_j);
    return labelled(refs[*idx]);
  }
  // The points the prediction allows, best first; the replay then has the last word.
  const std::vector<std::size_t> order =
      ranked_points(pts, deadline ? Goal{GoalKind::kDeadline, goal.value * (1 - a.margin)} : goal);
  if (order.empty() && deadline) {
    double tmin = 1e300;
    for (const auto& p : pts) tmin = std::min(tmin, p.time_s);
    throw InvalidInput(fmt::format(
        "--deadline {}: infeasible with --margin {}: the fastest plan is predicted at {} s per "
        "iteration; allowed: >= {} s",
        num(goal.value), num(a.margin), num(tmin), num(tmin / (1 - a.margin))));
  }
  if (order.empty()) throw_power_cap_infeasible(goal, pts);
  const double limit_w = deadline ? 0 : goal.power_limit_per_gpu_w();
  const EmulatorModel model(w.gpu());
  std::string tried;
  for (const std::size_t i : order) {
    Plan p = labelled(refs[i]);
    if (deadline) p.deadline_margin = a.margin;
    if (!replay) return p;
    const IterationResult rep = emulate_iteration(
        w, model, p.execution,
        [&p](int s, InstructionKind kind, int mb) { return p.settings(s, kind, mb); },
        p.clock_switch_s);
    p.replayed_time_s = rep.iteration_time_s;
    if (!deadline) {
      p.replayed_avg_power_per_gpu_w =
          average_power_per_gpu_w(rep.energy_j, rep.iteration_time_s, goal.gpus);
    }
    if (deadline ? rep.iteration_time_s <= goal.value : p.replayed_avg_power_per_gpu_w <= limit_w)
      return p;
    if (tried.size() < 200) {
      tried += deadline
                   ? fmt::format("{}{} s predicted, {} s replayed", tried.empty() ? "" : "; ",
                                 num(p.iteration_time_s), num(rep.iteration_time_s))
                   : fmt::format("{}{} W predicted, {} W replayed", tried.empty() ? "" : "; ",
                                 num(p.avg_power_per_gpu_w), num(p.replayed_avg_power_per_gpu_w));
    }
  }
  if (deadline) {
    throw InvalidInput(fmt::format(
        "--deadline {}: no plan predicted within --margin {} replays within the deadline ({}); "
        "raise the deadline or the margin",
        num(goal.value), num(a.margin), tried));
  }
  throw InvalidInput(fmt::format(
      "{} {}: no plan predicted within the cap ({} W per GPU) replays within it ({}); raise "
      "the cap",
      power_cap_flag(goal), num(goal.value), num(limit_w), tried));
}

/// `plan --from FRONTIER --stage-slowdown S=F`: the frontier re-read with those stages
/// stretched (replan.h). A deadline keeps --margin in the prediction and the emulator replays
/// the plan with the slowdown; a deadline the slowed frontier cannot meet takes the fastest plan
/// and says so on stderr (a re-plan in a running job must still give a plan).
Plan replan_from_frontier(const FrontierFile& ff, const std::vector<FrontierRef>& refs,
                          const PlanArgs& a, const Goal& goal, nlohmann::json& info) {
  const Workload& w = ff.workload;
  const std::vector<double> factor =
      parse_stage_slowdowns(a.stage_slowdown, w.parallel.pp, "--stage-slowdown");
  Goal within = goal;
  if (goal.kind == GoalKind::kDeadline) within.value = goal.value * (1 - a.margin);
  Replanned r = replan_frontier(ff, refs, factor, within);
  Plan& p = r.plan;
  p.goal = goal.describe() + " with stage slowdown " + describe_stage_slowdowns(factor) +
           (r.result.goal_met ? "" : " (not met: fastest plan)");
  if (r.result.from.method != Method::kKareus && method_from_string(a.method) == Method::kKareus) {
    p.label = kareus_plan_label(to_string(r.result.from.method));
  }
  const EmulatorModel model(w.gpu());
  const IterationResult rep = emulate_iteration(
      w, model, p.execution,
      [&p](int s, InstructionKind kind, int mb) { return p.settings(s, kind, mb); },
      p.clock_switch_s, factor);
  if (goal.kind == GoalKind::kDeadline && r.result.goal_met) {
    p.deadline_margin = a.margin;
    p.replayed_time_s = rep.iteration_time_s;
  }
  if (!r.result.goal_met) {
    std::cerr << "warning: " << r.result.note << "\n";
  } else if (goal.kind == GoalKind::kDeadline && rep.iteration_time_s > goal.value) {
    std::cerr << fmt::format(
        "warning: the re-planned plan is predicted at {} s but replays at {} s, over the "
        "deadline {} s; raise --margin\n",
        num(p.iteration_time_s), num(rep.iteration_time_s), num(goal.value));
  }
  info = {{"seconds", r.seconds},
          {"goal_met", r.result.goal_met},
          {"from_method", to_string(r.result.from.method)},
          {"from_point", r.result.from.index},
          {"start_time_s", r.result.start_time_s},
          {"start_energy_j", r.result.start_energy_j},
          {"moves", r.result.moves},
          {"replayed_time_s", rep.iteration_time_s},
          {"replayed_energy_j", rep.energy_j}};
  if (!r.result.goal_met) info["note"] = r.result.note;
  std::cerr << fmt::format(
      "re-planned for stage slowdown {} in {:.3f} s: from {} point {} ({:.4f} s, {:.1f} J under "
      "the slowdown) to {:.4f} s, {:.1f} J ({} instructions moved to cheaper options)\n",
      describe_stage_slowdowns(factor), r.seconds, to_string(r.result.from.method),
      r.result.from.index, r.result.start_time_s, r.result.start_energy_j, r.result.time_s,
      r.result.energy_j, r.result.moves);
  return p;
}

/// `plan --from FRONTIER`: the frontier's point for the goal, materialized without profiling or
/// solving. Planning flags are refused: the frontier was computed with its own options.
Plan plan_from_frontier(const CLI::App& cmd, const PlanArgs& a, Method method, const Goal& goal,
                        std::optional<Workload>& w, nlohmann::json& replan_info) {
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() > 0 && !used_with_from(opt->get_name())) {
      throw InvalidInput(fmt::format(
          "{}: not used with --from: {} was computed with its own options (its 'planner' "
          "field); drop the flag, or plan without --from",
          opt->get_name(), a.from));
    }
  }
  const FrontierFile ff = load_frontier_file(a.from);
  if (!a.file.empty()) {
    check_frontier_workload(ff, load_job(a.file));
  }
  w = ff.workload;
  ff.method(method);  // a clear error when the file lacks it
  const auto refs = plan_candidates(ff.methods, method, ff.merged, a.no_fallback);
  if (!a.stage_slowdown.empty()) return replan_from_frontier(ff, refs, a, goal, replan_info);
  return choose_plan(
      ff.methods, refs, a, goal, *w, true,
      [&ff](const FrontierRef& r, const std::string& g) { return ff.plan(r.method, r.index, g); });
}

/// `plan FILE`: profiles (or reads the store), solves the method's frontier (for Kareus also
/// Perseus's and Nanobatching+Perseus's, its fallbacks) and materializes the point for the goal.
Plan plan_from_scratch(const PlanArgs& a, Method method, const Goal& goal,
                       std::optional<Workload>& w) {
  w = load_job(a.file);
  PlannerProfiling session = open_planner_profiling(a.flags, *w);
  PipelineProgress progress(!a.flags.quiet);
  PlannerOptions o = session.options;
  for (int round = 0;; ++round) {
    Planner planner(*w, *session.full.cached, o, progress.callback(), session.screen_profiler());
    std::map<Method, MethodFrontier> f;
    if (method == Method::kKareus && !a.no_fallback) {
      for (Method m : {Method::kKareus, Method::kPerseus, Method::kNanobatchPerseus}) {
        f[m] = planner.frontier(m);
      }
    } else {
      f[method] = planner.frontier(method);
    }
    progress.finish();
    const std::vector<FrontierRef> merged = method == Method::kKareus && !a.no_fallback
                                                ? merge_with_fallbacks(f)
                                                : std::vector<FrontierRef>{};
    // The emulator replays only what the emulator predicted; other backends rely on the margin.
    const bool replay = a.flags.profiling.backend == "emulator";
    Plan plan = choose_plan(f, plan_candidates(f, method, merged, a.no_fallback), a, goal, *w,
                            replay, [&](const FrontierRef& r, const std::string& g) {
                              return planner.make_plan(f.at(r.method), r.index, g);
                            });
    // Plan-directed profiling: measure where this plan runs, then plan again (the profilers
    // remember every point, so a round re-measures nothing).
    if (round == o.focus_rounds || !add_focus_clocks(o, plan)) return plan;
  }
}

}  // namespace

void register_frontier(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("frontier", "Compute the iteration time-energy frontier");
  auto args = std::make_shared<FrontierArgs>();
  cmd->add_option("FILE", args->file, "workload YAML file")->required();
  cmd->add_option("--method", args->method,
                  "kareus, kareus_max_clock, nanobatch_perseus, nanobatch, perseus, megatron")
      ->capture_default_str();
  cmd->add_option("--dump-dag", args->dump_dag, "write the solver's DAG (JSON) to this file");
  cmd->add_flag("--json", args->json, "machine-readable output (every point with its plan)");
  cmd->add_flag("--all", args->all,
                "print every point (default: 10 evenly spaced points and the count)");
  add_planner_flags(cmd, args->flags);
  cmd->callback([&action, args] {
    action = [args] {
      const std::string& file = args->file;
      const std::string& dump_dag = args->dump_dag;
      const bool json = args->json;
      const PlannerFlags& flags = args->flags;
      const Method m = method_from_string(args->method);
      check_planner_flags(flags);
      if (flags.planner.focus_rounds > 0) {
        throw InvalidInput(
            "--focus-rounds: frontier hands out no plan whose clocks to focus on; use kareus "
            "plan (one goal's plan) or kareus optimize (its four operating points)");
      }
      if (!dump_dag.empty()) check_output("--dump-dag", dump_dag, OutputKind::kFile);
      const Workload w = load_job(file);
      PlannerProfiling session = open_planner_profiling(flags, w);
      PipelineProgress progress(!flags.quiet);
      Planner planner(w, *session.full.cached, session.options, progress.callback(),
                      session.screen_profiler());
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
        j["power_model"] = power_model_json(w.gpu());
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
      for (const std::size_t i : shown_points(f.points.size(), args->all)) {
        const auto& p = f.points[i];
        const ClockSchedule sch = schedule_with_switches(f, p.choice, f.clock_switch_s);
        int changes = 0;
        for (int c : sch.clock_changes) changes += c;
        t.add_row({fmt::format("{:.4f}", p.time_s), fmt::format("{:.1f}", p.energy_j),
                   fmt::format("{:.1f}", p.energy_j / p.time_s / w.cluster.gpus()),
                   std::to_string(changes)});
      }
      std::cout << t.render();
      if (!args->all && f.points.size() > kSummaryRows) {
        std::cout << fmt::format(
            "(showing {} of {} points, evenly spaced; --all prints every point, --json every "
            "point with its plan)\n",
            kSummaryRows, f.points.size());
      }
      std::cout << power_model_text(w.gpu());
      return 0;
    };
  });
}

void register_plan(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("plan", "Write the plan that meets a goal");
  auto args = std::make_shared<PlanArgs>();
  // Not ->required(): `kareus plan show PLAN` has no workload positional; checked below.
  cmd->add_option("FILE", args->file, "workload YAML file");
  auto* show = cmd->add_subcommand("show", "Summarize a plan file (clocks, SMs, slots, ranks)");
  auto show_args = std::make_shared<PlanShowArgs>();
  show->add_option("PLAN", show_args->file, "plan JSON file")->required();
  show->add_option("--workload", show_args->workload, "validate the plan against this workload");
  show->add_flag("--json", show_args->json, "machine-readable summary");
  show->add_option("--png", show_args->png,
                   "also draw the plan's timeline (a row per stage, bars coloured by SM clock)");
  show->callback([&action, show_args] {
    action = [show_args] {
      const PlanShowArgs& a = *show_args;
      // The picture, its script and data go beside each other: checked before any loading.
      if (!a.png.empty()) check_output("--png", a.png, OutputKind::kFileWithSiblings);
      std::optional<Workload> w;
      if (!a.workload.empty()) w = load_job(a.workload);
      const Plan p = w ? load_plan(a.file, *w) : load_plan(a.file);
      if (!a.png.empty()) {
        std::string error;
        if (!plot_timeline({{fmt::format("{} plan ({})", p.method, p.goal), &p}}, a.png, error))
          throw NotSupported("--png " + a.png + ": " + error);
      }
      const Workload* wp = w ? &*w : nullptr;
      if (a.json) {
        nlohmann::json j = plan_summary_json(p);
        j["metrics"] = plan_show_metrics(p, wp);
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << plan_summary_text(p) << plan_show_metrics_text(p, wp);
      }
      return 0;
    };
  });
  auto* g1 = cmd->add_option("--deadline", args->deadline, "least energy with iteration time <= S")
                 ->check(finite_in(0, true, kMaxDeadlineS, "seconds"));
  auto* g2 =
      cmd->add_option("--energy-budget", args->budget_j, "fastest with energy (J/iteration) <= J")
          ->check(finite_in(0, true, kMaxEnergyBudgetJ, "joules"));
  auto* g3 = cmd->add_flag("--max-throughput", args->max_tp, "fastest plan");
  auto* g4 = cmd->add_flag("--min-energy", args->min_e, "least-energy plan");
  auto* g5 = cmd->add_option("--power-cap-w", args->power_cap_w,
                             "fastest with average power per GPU over the iteration (whole-job "
                             "energy / (time x GPUs), static included) <= W")
                 ->check(finite_in(0, true, kMaxPowerCapW, "watts per GPU"));
  auto* g6 = cmd->add_option("--job-power-cap-kw", args->job_power_cap_kw,
                             "fastest with the whole job's average power (energy / iteration "
                             "time) <= KW kilowatts")
                 ->check(finite_in(0, true, kMaxJobPowerCapKw, "kilowatts"));
  cmd->add_option("--margin", args->margin,
                  "with --deadline: the predicted iteration time must stay this fraction below "
                  "the deadline; the chosen plan's emulator replay must meet the deadline too")
      ->capture_default_str()
      ->check(finite_in(0, false, 0.5, "fraction of the deadline"));
  g1->excludes(g2)->excludes(g3)->excludes(g4)->excludes(g5)->excludes(g6);
  g2->excludes(g3)->excludes(g4)->excludes(g5)->excludes(g6);
  g3->excludes(g4)->excludes(g5)->excludes(g6);
  g4->excludes(g5)->excludes(g6);
  g5->excludes(g6);
  cmd->add_option("--out", args->out, "plan file to write (required)");
  cmd->add_option("--from", args->from,
                  "pick the plan from this frontier.json of `kareus optimize` (no profiling or "
                  "solving; FILE, if given, must be the frontier's workload)");
  cmd->add_option("--method", args->method, "planning method (see `kareus frontier --help`)")
      ->capture_default_str();
  cmd->add_option("--stage-slowdown", args->stage_slowdown,
                  "with --from: re-plan for stragglers, STAGE=FACTOR (that stage's instructions "
                  "take FACTOR times as long; repeat for several stages): the goal's cheapest "
                  "plan under the slowdown, other stages slowed where they wait");
  cmd->add_flag("--no-fallback", args->no_fallback,
                "with --method kareus: choose among Kareus's own plans only, never a Perseus or "
                "Nanobatching+Perseus plan that would be better");
  cmd->add_flag("--json", args->json, "print the plan's summary as JSON");
  add_planner_flags(cmd, args->flags);
  cmd->callback([&action, cmd, args, show, g1, g2, g3, g4, g5, g6] {
    if (show->parsed()) return;  // `plan show` set the action
    action = [cmd, args, g1, g2, g3, g4, g5, g6] {
      const std::string& file = args->file;
      const std::string& out = args->out;
      const double deadline = args->deadline;
      const double budget_j = args->budget_j;
      const PlannerFlags& flags = args->flags;
      if (file.empty() && args->from.empty()) {
        throw InvalidInput(
            "plan needs a workload FILE or --from FRONTIER.json (or: kareus plan show PLAN)");
      }
      if (out.empty()) throw InvalidInput("plan needs --out PLAN.json");
      if (!args->stage_slowdown.empty() && args->from.empty()) {
        throw InvalidInput(
            "--stage-slowdown: needs --from FRONTIER.json (a re-plan re-reads a stored frontier)");
      }
      check_output("--out", out, OutputKind::kFile);
      const Method method = method_from_string(args->method);
      check_planner_flags(flags);
      Goal goal;
      if (g1->count()) {
        goal = {GoalKind::kDeadline, deadline};
      } else if (g2->count()) {
        goal = {GoalKind::kEnergyBudget, budget_j};
      } else if (g3->count()) {
        goal = {GoalKind::kMaxThroughput, 0};
      } else if (g4->count()) {
        goal = {GoalKind::kMinEnergy, 0};
      } else if (g5->count()) {
        goal = {GoalKind::kPowerCap, args->power_cap_w};  // the job's GPUs: choose_plan
      } else if (g6->count()) {
        goal = {GoalKind::kJobPowerCap, args->job_power_cap_kw};
      } else {
        throw InvalidInput(
            "plan needs a goal: --deadline S, --energy-budget J, --max-throughput, --min-energy, "
            "--power-cap-w W or --job-power-cap-kw KW");
      }
      std::optional<Workload> w;
      nlohmann::json replan_info;
      const Plan p = args->from.empty()
                         ? plan_from_scratch(*args, method, goal, w)
                         : plan_from_frontier(*cmd, *args, method, goal, w, replan_info);
      save_plan(p, out);
      if (args->json) {
        nlohmann::json j = {{"plan", out},
                            {"goal", p.goal},
                            {"method", p.method},
                            {"label", p.label},
                            {"iteration_time_s", p.iteration_time_s},
                            {"energy_j", p.energy_j},
                            {"clock_changes", p.clock_changes()},
                            {"metrics", plan_show_metrics(p, &*w)},
                            {"power_model", power_model_json(w->gpu())}};
        if (p.deadline_margin >= 0) j["deadline_margin"] = p.deadline_margin;
        if (p.replayed_time_s >= 0) j["replayed_time_s"] = p.replayed_time_s;
        if (!p.stage_slowdown.empty()) j["stage_slowdown"] = p.stage_slowdown;
        if (!replan_info.is_null()) j["replan"] = replan_info;
        j["avg_power_per_gpu_w"] = p.avg_power_per_gpu_w;
        j["peak_instruction_power_w"] = p.peak_instruction_power_w;
        if (p.replayed_avg_power_per_gpu_w >= 0)
          j["replayed_avg_power_per_gpu_w"] = p.replayed_avg_power_per_gpu_w;
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << fmt::format(
            "{}: {}, {} -> {:.4f} s, {:.1f} J per iteration (whole job), {} clock "
            "changes\n{}",
            out, p.label, p.goal, p.iteration_time_s, p.energy_j, p.clock_changes(),
            plan_show_metrics_text(p, &*w));
        if (p.deadline_margin >= 0) {
          std::cout << fmt::format(
              "deadline margin {:.2f}%: predicted {:.4f} s <= {:.4f} s{}\n",
              100 * p.deadline_margin, p.iteration_time_s, deadline * (1 - p.deadline_margin),
              p.replayed_time_s >= 0
                  ? fmt::format("; emulator replay {:.4f} s <= deadline {:.4f} s",
                                p.replayed_time_s, deadline)
                  : std::string("; not replayed (backend is not the emulator)"));
        }
        if (goal.power_cap()) std::cout << power_cap_text(goal, p, w->cluster.gpus());
        std::cout << plan_power_text(p) << power_model_text(w->gpu());
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
