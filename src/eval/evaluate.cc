// Evaluation of one workload against the baselines (metrics as in the Kareus paper: iso-time,
// iso-energy, maximum-throughput mode, ablations), its report and its plot.
#include "kareus/evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kareus/error.h"
#include "kareus/pareto.h"
#include "kareus/process.h"
#include "kareus/table.h"

namespace kareus {
namespace {

std::vector<FrontierSummaryPoint> summary(const MethodFrontier& f) {
  std::vector<FrontierSummaryPoint> out;
  for (const auto& p : f.points) out.push_back({p.time_s, p.energy_j, to_string(f.method)});
  return out;
}

double pct(double base, double value) {
  const double v = 100.0 * (base - value) / base;
  return v == 0 ? 0.0 : v;  // no "-0.0%"
}

// Least energy among points no slower than `deadline` (the fastest point if none is).
const FrontierSummaryPoint& best_within(const std::vector<FrontierSummaryPoint>& f,
                                        double deadline) {
  const FrontierSummaryPoint* best = nullptr;
  for (const auto& p : f) {
    if (p.iteration_time_s <= deadline * (1 + 1e-9) && (!best || p.energy_j < best->energy_j))
      best = &p;
  }
  if (best) return *best;
  return *std::min_element(f.begin(), f.end(), [](const auto& a, const auto& b) {
    return a.iteration_time_s < b.iteration_time_s;
  });
}

}  // namespace

WorkloadEvaluation evaluate_workload(const Workload& w, CachedProfiler& profiler,
                                     const PlannerOptions& o, const PlannerProgress& progress,
                                     bool collect_frontier_plans) {
  const auto t0 = std::chrono::steady_clock::now();
  WorkloadEvaluation e;
  e.workload = w.name;
  e.gpus = w.cluster.gpus();
  Planner planner(w, profiler, o, progress);
  e.searches = planner.search_partitions();
  std::map<Method, MethodFrontier> f;
  for (Method m : {Method::kKareus, Method::kPerseus, Method::kNanobatchPerseus,
                   Method::kKareusMaxClock, Method::kMegatron, Method::kNanobatch}) {
    f[m] = planner.frontier(m);
    if (f[m].points.empty()) {
      throw InternalError(fmt::format("{}: empty {} frontier", w.name, to_string(m)));
    }
  }
  e.kareus_only = summary(f[Method::kKareus]);
  e.perseus = summary(f[Method::kPerseus]);
  e.nanobatch_perseus = summary(f[Method::kNanobatchPerseus]);
  e.kareus_max_clock = summary(f[Method::kKareusMaxClock]);
  e.megatron = summary(f[Method::kMegatron]).front();
  e.nanobatch = summary(f[Method::kNanobatch]).front();

  // Kareus's frontier: its own plans, or a baseline's where that is better (fallback).
  struct Ref {
    Method m;
    std::size_t i;
  };
  std::vector<Ref> refs;
  std::vector<Point2> pts;
  for (Method m : {Method::kKareus, Method::kPerseus, Method::kNanobatchPerseus}) {
    for (std::size_t i = 0; i < f[m].points.size(); ++i) {
      refs.push_back({m, i});
      pts.push_back({f[m].points[i].time_s, f[m].points[i].energy_j});
    }
  }
  std::vector<Ref> merged;
  for (std::size_t k : pareto_front(pts)) merged.push_back(refs[k]);
  int from_baseline = 0;
  double lo = 1e300, hi = 0;
  for (const auto& r : merged) {
    const auto& p = f[r.m].points[r.i];
    e.kareus.push_back({p.time_s, p.energy_j, to_string(r.m)});
    if (r.m != Method::kKareus) {
      ++from_baseline;
      lo = std::min(lo, p.time_s);
      hi = std::max(hi, p.time_s);
    }
  }
  e.fallback = from_baseline > 0;
  if (e.fallback) {
    e.fallback_note = fmt::format(
        "overlap does not pay off everywhere: {} of {} frontier points are baseline plans "
        "(iteration times {:.3f}..{:.3f} s); Kareus falls back to them there",
        from_baseline, merged.size(), lo, hi);
  }
  auto point_of = [&](const Ref& r) -> const FrontierPoint& { return f[r.m].points[r.i]; };

  // Metrics.
  e.perseus_fastest = e.perseus.front();
  e.perseus_min_energy =
      *std::min_element(e.perseus.begin(), e.perseus.end(),
                        [](const auto& a, const auto& b) { return a.energy_j < b.energy_j; });
  std::size_t iso_t = 0, iso_e = 0, fastest = 0, min_e = 0;
  bool have_iso_t = false, have_iso_e = false;
  for (std::size_t k = 0; k < merged.size(); ++k) {
    const auto& p = point_of(merged[k]);
    if (p.time_s <= e.perseus_fastest.iteration_time_s * (1 + 1e-9) &&
        (!have_iso_t || p.energy_j < point_of(merged[iso_t]).energy_j)) {
      iso_t = k;
      have_iso_t = true;
    }
    if (p.energy_j <= e.perseus_min_energy.energy_j * (1 + 1e-9) &&
        (!have_iso_e || p.time_s < point_of(merged[iso_e]).time_s)) {
      iso_e = k;
      have_iso_e = true;
    }
    if (p.time_s < point_of(merged[fastest]).time_s) fastest = k;
    if (p.energy_j < point_of(merged[min_e]).energy_j) min_e = k;
  }
  // Perseus's own plans are in the merged set, so both always exist.
  if (!have_iso_t || !have_iso_e) throw InternalError("iso-time or iso-energy point missing");
  e.iso_time_point = e.kareus[iso_t];
  e.iso_energy_point = e.kareus[iso_e];
  e.iso_time_energy_saving_pct = pct(e.perseus_fastest.energy_j, e.iso_time_point.energy_j);
  e.iso_energy_time_saving_pct =
      pct(e.perseus_min_energy.iteration_time_s, e.iso_energy_point.iteration_time_s);
  e.max_throughput_time_saving_pct =
      pct(e.megatron.iteration_time_s, e.kareus[fastest].iteration_time_s);
  e.max_throughput_energy_saving_pct = pct(e.megatron.energy_j, e.kareus[fastest].energy_j);
  const double deadline = e.perseus_fastest.iteration_time_s;
  e.ablation_no_freq_energy_increase_pct =
      -pct(e.iso_time_point.energy_j, best_within(e.kareus_max_clock, deadline).energy_j);
  e.ablation_no_sched_energy_increase_pct =
      -pct(e.iso_time_point.energy_j, best_within(e.nanobatch_perseus, deadline).energy_j);

  // Plans and their replay through the whole-iteration emulation.
  const std::pair<const char*, std::size_t> chosen[] = {{"max-throughput", fastest},
                                                        {"min-energy", min_e},
                                                        {"iso-time", iso_t},
                                                        {"iso-energy", iso_e}};
  const EmulatorModel model(w.gpu());
  for (const auto& [name, k] : chosen) {
    const Ref& r = merged[k];
    Plan p = planner.make_plan(f[r.m], r.i, name);
    // Replayed with the switch cost the plan was made with (the GPU's, unless overridden).
    const IterationResult rep = emulate_iteration(
        w, model, p.execution,
        [&p](int s, InstructionKind kind, int mb) { return p.settings(s, kind, mb); },
        p.clock_switch_s);
    e.replays.push_back({name, p.iteration_time_s, rep.iteration_time_s, p.energy_j, rep.energy_j});
    e.plans.emplace(name, std::move(p));
  }
  if (collect_frontier_plans) {
    e.frontier_plans = nlohmann::json::array();
    for (std::size_t k = 0; k < merged.size(); ++k) {
      const auto& p = point_of(merged[k]);
      e.frontier_plans.push_back(
          {{"iteration_time_s", p.time_s},
           {"energy_j", p.energy_j},
           {"method", to_string(merged[k].m)},
           {"plan", planner.make_plan(f[merged[k].m], merged[k].i, "frontier point").to_json()}});
    }
  }
  e.measured = planner.measurements();
  e.reused = planner.reused();
  // Each point occupies a whole node on real hardware.
  e.real_gpu_hours =
      (e.measured + e.reused) * kRealSecondsPerPoint * w.cluster.gpus_per_node / 3600.0;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return e;
}

namespace {
nlohmann::json points_json(const std::vector<FrontierSummaryPoint>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : v)
    a.push_back({{"iteration_time_s", p.iteration_time_s}, {"energy_j", p.energy_j}});
  return a;
}
nlohmann::json point_json(const FrontierSummaryPoint& p) {
  return {{"iteration_time_s", p.iteration_time_s}, {"energy_j", p.energy_j}, {"method", p.method}};
}
}  // namespace

nlohmann::json to_json(const WorkloadEvaluation& e, bool with_plans) {
  nlohmann::json j;
  j["workload"] = e.workload;
  j["gpus"] = e.gpus;
  j["iso_time_energy_saving_pct"] = e.iso_time_energy_saving_pct;
  j["iso_energy_time_saving_pct"] = e.iso_energy_time_saving_pct;
  j["max_throughput_time_saving_pct"] = e.max_throughput_time_saving_pct;
  j["max_throughput_energy_saving_pct"] = e.max_throughput_energy_saving_pct;
  j["ablation_no_freq_energy_increase_pct"] = e.ablation_no_freq_energy_increase_pct;
  j["ablation_no_sched_energy_increase_pct"] = e.ablation_no_sched_energy_increase_pct;
  j["fallback"] = e.fallback;
  j["fallback_note"] = e.fallback_note;
  j["kareus"] = points_json(e.kareus);
  j["kareus_methods"] = nlohmann::json::array();
  for (const auto& p : e.kareus) j["kareus_methods"].push_back(p.method);
  j["kareus_without_fallback"] = points_json(e.kareus_only);
  j["perseus"] = points_json(e.perseus);
  j["nanobatch_perseus"] = points_json(e.nanobatch_perseus);
  j["kareus_max_clock"] = points_json(e.kareus_max_clock);
  j["megatron"] = {{"iteration_time_s", e.megatron.iteration_time_s},
                   {"energy_j", e.megatron.energy_j}};
  j["nanobatch"] = {{"iteration_time_s", e.nanobatch.iteration_time_s},
                    {"energy_j", e.nanobatch.energy_j}};
  j["operating_points"] = {{"perseus_fastest", point_json(e.perseus_fastest)},
                           {"perseus_min_energy", point_json(e.perseus_min_energy)},
                           {"kareus_iso_time", point_json(e.iso_time_point)},
                           {"kareus_iso_energy", point_json(e.iso_energy_point)}};
  j["profiling"] = {{"points", e.measured + e.reused},
                    {"measured", e.measured},
                    {"reused", e.reused},
                    {"real_gpu_hours", e.real_gpu_hours}};
  for (const auto& s : e.searches) {
    j["profiling"]["partitions"].push_back({{"key", s.key},
                                            {"space", s.space},
                                            {"evaluations", s.evaluations},
                                            {"coverage_points", s.coverage_points}});
  }
  for (const auto& r : e.replays) {
    j["replay"].push_back({{"plan", r.plan},
                           {"predicted_time_s", r.predicted_time_s},
                           {"emulated_time_s", r.emulated_time_s},
                           {"predicted_energy_j", r.predicted_energy_j},
                           {"emulated_energy_j", r.emulated_energy_j},
                           {"time_error", r.time_error()},
                           {"energy_error", r.energy_error()}});
  }
  if (with_plans) {
    for (const auto& [name, p] : e.plans) j["plans"][name] = p.to_json();
  }
  j["seconds"] = e.seconds;
  return j;
}

std::string comparison_table(const WorkloadEvaluation& e) {
  TextTable t({"method", "plan", "iteration time (s)", "energy (kJ)", "time vs Megatron",
               "energy vs Megatron"});
  auto row = [&](const std::string& m, const std::string& plan, const FrontierSummaryPoint& p) {
    t.add_row({m, plan, fmt::format("{:.3f}", p.iteration_time_s),
               fmt::format("{:.2f}", p.energy_j / 1e3),
               fmt::format("{:+.1f}%", 0.0 - pct(e.megatron.iteration_time_s, p.iteration_time_s)),
               fmt::format("{:+.1f}%", 0.0 - pct(e.megatron.energy_j, p.energy_j))});
  };
  auto fastest = [](const std::vector<FrontierSummaryPoint>& v) { return v.front(); };
  auto cheapest = [](const std::vector<FrontierSummaryPoint>& v) {
    return *std::min_element(v.begin(), v.end(),
                             [](const auto& a, const auto& b) { return a.energy_j < b.energy_j; });
  };
  row("Megatron-LM", "max clock", e.megatron);
  row("Nanobatching", "max clock", e.nanobatch);
  row("Perseus", "fastest", fastest(e.perseus));
  row("Perseus", "min energy", cheapest(e.perseus));
  row("Nanobatching+Perseus", "fastest", fastest(e.nanobatch_perseus));
  row("Nanobatching+Perseus", "min energy", cheapest(e.nanobatch_perseus));
  row("Kareus", "fastest", fastest(e.kareus));
  row("Kareus", "iso-time", e.iso_time_point);
  row("Kareus", "iso-energy", e.iso_energy_point);
  row("Kareus", "min energy", cheapest(e.kareus));
  row("Kareus w/o freq. scaling", "fastest", fastest(e.kareus_max_clock));
  return t.render();
}

std::string metrics_table(const WorkloadEvaluation& e) {
  std::string s =
      "| metric | this run | paper (best case, brief section 8) |\n| --- | --- | --- |\n";
  s += fmt::format("| iso-time energy saving vs Perseus | {:.2f}% | up to {}% |\n",
                   e.iso_time_energy_saving_pct, PaperHeadline::iso_time_energy_saving_pct);
  s += fmt::format("| iso-energy time saving vs Perseus | {:.2f}% | up to {}% |\n",
                   e.iso_energy_time_saving_pct, PaperHeadline::iso_energy_time_saving_pct);
  s += fmt::format("| max-throughput time saving vs Megatron-LM | {:.2f}% | up to {}% |\n",
                   e.max_throughput_time_saving_pct, PaperHeadline::max_throughput_time_saving_pct);
  s += fmt::format("| max-throughput energy saving vs Megatron-LM | {:.2f}% | up to {}% |\n",
                   e.max_throughput_energy_saving_pct,
                   PaperHeadline::max_throughput_energy_saving_pct);
  s += fmt::format("| energy increase without frequency scaling | {:.2f}% | - |\n",
                   e.ablation_no_freq_energy_increase_pct);
  s += fmt::format("| energy increase without kernel scheduling | {:.2f}% | {}% |\n",
                   e.ablation_no_sched_energy_increase_pct,
                   PaperHeadline::ablation_no_sched_energy_increase_pct);
  return s;
}

std::string workload_report(const WorkloadEvaluation& e, const std::string& png_name) {
  std::string s = fmt::format("# Kareus report: {}\n\n", e.workload);
  s += "All numbers come from Kareus's embedded emulator (docs/emulator.md), not from GPUs. Energy "
       "is the whole job's (all " +
       std::to_string(e.gpus) +
       " GPUs) per training iteration, static "
       "energy included. Every method ran through the same composition and frontier solver on the "
       "same measurements.\n\n";
  s += "## Profiling cost\n\n";
  s += fmt::format(
      "{} configurations profiled ({} measured in this run, {} from the profile store); "
      "on real hardware at 5 s + 5 s per point on one node that is {:.1f} GPU-hours.\n\n",
      e.measured + e.reused, e.measured, e.reused, e.real_gpu_hours);
  s += "| partition | configurations | searched |\n| --- | --- | --- |\n";
  for (const auto& p : e.searches)
    s += fmt::format("| {} | {} | {} |\n", p.key, p.space, p.evaluations + p.coverage_points);
  s += "\n## Comparison\n\n```\n" + comparison_table(e) + "```\n\n";
  s += metrics_table(e);
  s += fmt::format("\nfallback: {}{}\n\n", e.fallback ? "yes" : "no",
                   e.fallback ? " (" + e.fallback_note + ")" : "");
  if (!png_name.empty()) s += fmt::format("![time-energy frontiers]({})\n\n", png_name);
  s += "## Plans and their replay\n\nEach plan is replayed by the whole-iteration emulation "
       "(`kareus emulate --plan`), independently of the composition that predicted it.\n\n"
       "| plan | predicted time (s) | emulated time (s) | error | predicted energy (J) | emulated "
       "energy (J) | error |\n"
       "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& r : e.replays) {
    s += fmt::format("| {} | {:.4f} | {:.4f} | {:+.2f}% | {:.1f} | {:.1f} | {:+.2f}% |\n", r.plan,
                     r.predicted_time_s, r.emulated_time_s, 100 * r.time_error(),
                     r.predicted_energy_j, r.emulated_energy_j, 100 * r.energy_error());
  }
  return s;
}

std::string suite_report(const std::vector<WorkloadEvaluation>& all, double seconds) {
  std::string s = "# Kareus evaluation: paper suite\n\n";
  s += fmt::format(
      "{} workloads on the embedded emulator in {:.0f} s. Savings in percent; iso-time "
      "and iso-energy against Perseus, max-throughput against Megatron-LM; ablations "
      "are the energy increase at Perseus's fastest iteration time.\n\n",
      all.size(), seconds);
  s += "| workload | iso-time energy saving | iso-energy time saving | max-throughput time saving "
       "| max-throughput energy saving | no freq. scaling | no scheduling | fallback |\n";
  s += "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  double sum[6] = {0}, best[6] = {-1e9, -1e9, -1e9, -1e9, -1e9, -1e9};
  for (const auto& e : all) {
    const double v[6] = {
        e.iso_time_energy_saving_pct,           e.iso_energy_time_saving_pct,
        e.max_throughput_time_saving_pct,       e.max_throughput_energy_saving_pct,
        e.ablation_no_freq_energy_increase_pct, e.ablation_no_sched_energy_increase_pct};
    s += fmt::format("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {} |\n",
                     e.workload, v[0], v[1], v[2], v[3], v[4], v[5], e.fallback ? "yes" : "no");
    for (int k = 0; k < 6; ++k) {
      sum[k] += v[k];
      best[k] = std::max(best[k], v[k]);
    }
  }
  const double n = static_cast<double>(std::max<std::size_t>(1, all.size()));
  s += fmt::format("| **mean** | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | |\n",
                   sum[0] / n, sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, sum[5] / n);
  s += fmt::format("| **best** | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | |\n",
                   best[0], best[1], best[2], best[3], best[4], best[5]);
  s += fmt::format("| paper (up to) | {} | {} | {} | {} | - | {} | |\n\n",
                   PaperHeadline::iso_time_energy_saving_pct,
                   PaperHeadline::iso_energy_time_saving_pct,
                   PaperHeadline::max_throughput_time_saving_pct,
                   PaperHeadline::max_throughput_energy_saving_pct,
                   PaperHeadline::ablation_no_sched_energy_increase_pct);
  double worst_replay = 0;
  for (const auto& e : all) {
    for (const auto& r : e.replays) {
      worst_replay = std::max({worst_replay, std::abs(r.time_error()), std::abs(r.energy_error())});
    }
  }
  s += fmt::format(
      "Every reported plan was replayed by the whole-iteration emulation; the largest "
      "deviation from its prediction was {:.2f}%.\n",
      100 * worst_replay);
  return s;
}

namespace {

// The plotting script, written next to the data so a user can re-run or restyle it.
const char* kPlotScript = R"PY(import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.load(open(sys.argv[1]))
fig, ax = plt.subplots(figsize=(7.5, 5))
styles = [("kareus", "Kareus", "C3", "o"), ("nanobatch_perseus", "Nanobatching + Perseus", "C0", "s"),
          ("perseus", "Perseus (Megatron-LM + Perseus)", "C2", "^"),
          ("kareus_max_clock", "Kareus w/o frequency scaling", "C1", "d")]
for key, label, color, marker in styles:
    pts = data[key]
    if not pts:
        continue
    t = [p["iteration_time_s"] for p in pts]
    e = [p["energy_j"] / 1e3 for p in pts]
    ax.plot(t, e, color=color, marker=marker, markersize=3, linewidth=1.5, label=label)
for key, label, color, marker in [("megatron", "Megatron-LM", "k", "*"), ("nanobatch", "Nanobatching", "C4", "X")]:
    p = data[key]
    ax.plot([p["iteration_time_s"]], [p["energy_j"] / 1e3], linestyle="none", color=color,
            marker=marker, markersize=12, label=label)
ax.set_xlabel("Iteration time (s)")
ax.set_ylabel("Energy per iteration, whole job (kJ)")
ax.set_title(data["workload"] + " (emulated)")
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=150)
)PY";

}  // namespace

bool plot_frontiers(const WorkloadEvaluation& e, const std::string& png_path, std::string& error) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(png_path).parent_path().empty() ? fs::path(".") : fs::path(png_path).parent_path();
  const fs::path script = dir / "plot_frontier.py";
  const fs::path data = dir / "frontier_plot_data.json";
  std::ofstream(script) << kPlotScript;
  std::ofstream(data) << to_json(e, false).dump() << "\n";
  // Debian's interpreter has python3-matplotlib; another python3 first on PATH may not.
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const fs::path log_path = dir / "plot.log";
  fs::remove(log_path);
  const ProcessResult r =
      run_process({python, script.string(), data.string(), png_path}, log_path.string());
  if (!r.ok() || !fs::exists(png_path)) {
    std::ifstream log(log_path);
    std::string line, last;
    bool no_matplotlib = false;
    while (std::getline(log, line)) {
      if (!line.empty()) last = line;
      if (line.find("No module named 'matplotlib'") != std::string::npos) no_matplotlib = true;
    }
    const std::string why = r.ok() ? "it wrote no " + png_path : r.error;
    error = fmt::format("plotting with {} failed: {}{}{}", python, why,
                        last.empty() ? "" : " (last output: " + last + ")",
                        no_matplotlib ? "; install python3-matplotlib" : "");
    return false;
  }
  fs::remove(dir / "plot.log");
  return true;
}

}  // namespace kareus
