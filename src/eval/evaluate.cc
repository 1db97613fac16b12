// Evaluation of one workload against the baselines (metrics as in the Kareus paper: iso-time,
// iso-energy, maximum-throughput mode, ablations) and its JSON form; report.cc writes the
// tables, the report and the pictures. One function per stage, run in order by
// evaluate_workload: frontiers, Kareus's merged frontier, operating points, plans.
#include "kareus/evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/frontier_file.h"
#include "kareus/interrupt.h"
#include "kareus/pareto.h"

namespace kareus {

const FrontierSummaryPoint& max_throughput_point(const std::vector<FrontierSummaryPoint>& v) {
  if (v.empty()) throw InternalError("max_throughput_point of an empty frontier");
  return v[max_throughput_index(
      v, [](const FrontierSummaryPoint& p) { return p.iteration_time_s; },
      [](const FrontierSummaryPoint& p) { return p.energy_j; })];
}

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

namespace {

// A point of one method's frontier.
struct Ref {
  Method m;
  std::size_t i;
};
using Frontiers = std::map<Method, MethodFrontier>;

Frontiers method_frontiers(const Workload& w, Planner& planner) {
  Frontiers f;
  for (Method m : {Method::kKareus, Method::kPerseus, Method::kNanobatchPerseus,
                   Method::kKareusMaxClock, Method::kMegatron, Method::kNanobatch}) {
    f[m] = planner.frontier(m);
    if (f[m].points.empty()) {
      throw InternalError(fmt::format("{}: empty {} frontier", w.name, to_string(m)));
    }
  }
  return f;
}

// Kareus's frontier: its own plans, or a baseline's where that is better (fallback). Fills
// e.kareus and the fallback fields; returns where each merged point comes from.
std::vector<Ref> merge_kareus_frontier(const Frontiers& f, WorkloadEvaluation& e) {
  std::vector<Ref> merged;
  for (const FrontierRef& r : merge_with_fallbacks(f)) merged.push_back({r.method, r.index});
  int from_baseline = 0;
  double lo = 1e300, hi = 0;
  for (const auto& r : merged) {
    const auto& p = f.at(r.m).points[r.i];
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
        "(iteration times {:.3f}..{:.3f} s); Kareus falls back to them there and labels them "
        "\"Kareus (<baseline> plan)\"",
        from_baseline, merged.size(), lo, hi);
  }
  return merged;
}

}  // namespace

// Where Kareus's own frontier stands against the baselines, without the fallback: its losses,
// its own iso-time point, and whether it is entirely faster than Perseus.
void compare_own_frontier(WorkloadEvaluation& e) {
  e.own_losses = {frontier_loss(e.kareus_only, e.perseus, "perseus"),
                  frontier_loss(e.kareus_only, e.nanobatch_perseus, "nanobatch_perseus")};
  const FrontierSummaryPoint& perseus_fastest = max_throughput_point(e.perseus);
  const double t_ref = perseus_fastest.iteration_time_s;
  for (const auto& p : e.kareus_only) {
    if (p.iteration_time_s <= t_ref * (1 + 1e-9) &&
        (!e.own_has_iso_time || p.energy_j < e.own_iso_time_point.energy_j)) {
      e.own_iso_time_point = p;
      e.own_has_iso_time = true;
    }
  }
  if (e.own_has_iso_time) {
    e.own_iso_time_energy_saving_pct = pct(perseus_fastest.energy_j, e.own_iso_time_point.energy_j);
  }
  double own_slowest = 0;
  for (const auto& p : e.kareus_only) own_slowest = std::max(own_slowest, p.iteration_time_s);
  if (own_slowest < t_ref) {
    e.iso_time_note = fmt::format(
        "Kareus's slowest own plan ({:.3f} s) is faster than Perseus's fastest ({:.3f} s): "
        "iso-time compares a faster plan with Perseus's, so part of the energy difference is "
        "time, not efficiency",
        own_slowest, t_ref);
  }
}

std::string kareus_plan_label(const std::string& method) {
  if (method == to_string(Method::kKareus)) return "Kareus";
  return fmt::format("Kareus ({} plan)", display_name(method_from_string(method)));
}

FrontierLoss frontier_loss(const std::vector<FrontierSummaryPoint>& own,
                           const std::vector<FrontierSummaryPoint>& baseline,
                           const std::string& baseline_name) {
  FrontierLoss l;
  l.baseline = baseline_name;
  if (own.empty() || baseline.empty()) return l;
  auto fastest = [](const std::vector<FrontierSummaryPoint>& v) {
    double t = 1e300;
    for (const auto& p : v) t = std::min(t, p.iteration_time_s);
    return t;
  };
  auto best = [](const std::vector<FrontierSummaryPoint>& v, double deadline) {
    double e = 1e300;
    for (const auto& p : v) {
      if (p.iteration_time_s <= deadline) e = std::min(e, p.energy_j);
    }
    return e;
  };
  const double lo = std::max(fastest(own), fastest(baseline));
  std::vector<double> deadlines;
  for (const auto* v : {&own, &baseline}) {
    for (const auto& p : *v) {
      if (p.iteration_time_s >= lo) deadlines.push_back(p.iteration_time_s);
    }
  }
  std::sort(deadlines.begin(), deadlines.end());
  deadlines.erase(std::unique(deadlines.begin(), deadlines.end()), deadlines.end());
  for (const double d : deadlines) {
    ++l.deadlines;
    const double eo = best(own, d), eb = best(baseline, d);
    if (eo <= eb * (1 + 1e-9)) continue;
    if (l.lost == 0) l.from_s = d;
    l.to_s = d;
    ++l.lost;
    l.worst_excess_pct = std::max(l.worst_excess_pct, 100.0 * (eo / eb - 1.0));
  }
  return l;
}

std::vector<FrontierRef> merge_with_fallbacks(const std::map<Method, MethodFrontier>& f) {
  std::vector<FrontierRef> refs;
  std::vector<Point2> pts;
  for (Method m : {Method::kKareus, Method::kPerseus, Method::kNanobatchPerseus}) {
    for (std::size_t i = 0; i < f.at(m).points.size(); ++i) {
      refs.push_back({m, i});
      pts.push_back({f.at(m).points[i].time_s, f.at(m).points[i].energy_j});
    }
  }
  std::vector<FrontierRef> merged;
  for (std::size_t k : pareto_front(pts)) merged.push_back(refs[k]);
  return merged;
}

nlohmann::json power_model_json(const GpuSpec& gpu) {
  return {{"calibrated", gpu.power_calibrated}, {"source", gpu.power_source}};
}

namespace {

// Indices into the merged frontier of the four written plans.
struct Chosen {
  std::size_t fastest = 0, min_energy = 0, iso_time = 0, iso_energy = 0;
};

// The operating points and the paper's metrics (iso-time, iso-energy, max-throughput,
// ablations) from the merged frontier e.kareus.
Chosen operating_points(WorkloadEvaluation& e) {
  e.perseus_fastest = max_throughput_point(e.perseus);
  e.perseus_min_energy =
      *std::min_element(e.perseus.begin(), e.perseus.end(),
                        [](const auto& a, const auto& b) { return a.energy_j < b.energy_j; });
  Chosen c;
  bool have_iso_t = false, have_iso_e = false;
  const auto& k = e.kareus;
  for (std::size_t i = 0; i < k.size(); ++i) {
    const auto& p = k[i];
    if (p.iteration_time_s <= e.perseus_fastest.iteration_time_s * (1 + 1e-9) &&
        (!have_iso_t || p.energy_j < k[c.iso_time].energy_j)) {
      c.iso_time = i;
      have_iso_t = true;
    }
    if (p.energy_j <= e.perseus_min_energy.energy_j * (1 + 1e-9) &&
        (!have_iso_e || p.iteration_time_s < k[c.iso_energy].iteration_time_s)) {
      c.iso_energy = i;
      have_iso_e = true;
    }
    if (p.energy_j < k[c.min_energy].energy_j) c.min_energy = i;
  }
  c.fastest = max_throughput_index(
      k, [](const FrontierSummaryPoint& p) { return p.iteration_time_s; },
      [](const FrontierSummaryPoint& p) { return p.energy_j; });
  // Perseus's own plans are in the merged set, so both always exist.
  if (!have_iso_t || !have_iso_e) throw InternalError("iso-time or iso-energy point missing");
  e.iso_time_point = k[c.iso_time];
  e.iso_energy_point = k[c.iso_energy];
  e.iso_time_energy_saving_pct = pct(e.perseus_fastest.energy_j, e.iso_time_point.energy_j);
  e.iso_energy_time_saving_pct =
      pct(e.perseus_min_energy.iteration_time_s, e.iso_energy_point.iteration_time_s);
  e.max_throughput_time_saving_pct =
      pct(e.megatron.iteration_time_s, k[c.fastest].iteration_time_s);
  e.max_throughput_energy_saving_pct = pct(e.megatron.energy_j, k[c.fastest].energy_j);
  const double deadline = e.perseus_fastest.iteration_time_s;
  e.ablation_no_freq_energy_increase_pct =
      -pct(e.iso_time_point.energy_j, best_within(e.kareus_max_clock, deadline).energy_j);
  e.ablation_no_sched_energy_increase_pct =
      -pct(e.iso_time_point.energy_j, best_within(e.nanobatch_perseus, deadline).energy_j);
  return c;
}

// The four plans, each replayed by the whole-iteration emulation, and Megatron-LM's plan.
void make_plans(const Workload& w, const Planner& planner, const Frontiers& f,
                const std::vector<Ref>& merged, const Chosen& c, WorkloadEvaluation& e) {
  const std::pair<const char*, std::size_t> chosen[] = {{"max-throughput", c.fastest},
                                                        {"min-energy", c.min_energy},
                                                        {"iso-time", c.iso_time},
                                                        {"iso-energy", c.iso_energy}};
  const EmulatorModel model(w.gpu());
  for (const auto& [name, k] : chosen) {
    const Ref& r = merged[k];
    Plan p = planner.make_plan(f.at(r.m), r.i, name);
    p.label = kareus_plan_label(to_string(r.m));
    // Replayed with the switch cost the plan was made with (the GPU's, unless overridden).
    const IterationResult rep = emulate_iteration(
        w, model, p.execution,
        [&p](int s, InstructionKind kind, int mb) { return p.settings(s, kind, mb); },
        p.clock_switch_s);
    e.replays.push_back({name, p.iteration_time_s, rep.iteration_time_s, p.energy_j, rep.energy_j});
    e.plans.emplace(name, std::move(p));
  }
  e.megatron_plan = planner.make_plan(f.at(Method::kMegatron), 0, "Megatron-LM");
}

// Every method's frontier in compact form, the merged frontier as references to it
// (frontier_file.h); `kareus plan --from` materializes plans on demand.
nlohmann::json frontier_plans_json(const Frontiers& f, const std::vector<Ref>& merged) {
  std::vector<FrontierRef> refs;
  refs.reserve(merged.size());
  for (const Ref& r : merged) refs.push_back({r.m, r.i});
  return frontiers_to_json(f, refs);
}

}  // namespace

namespace {

// One round of evaluate_workload: plans with `o` as it stands.
WorkloadEvaluation evaluate_once(const Workload& w, CachedProfiler& profiler,
                                 const PlannerOptions& o, const PlannerProgress& progress,
                                 bool collect_frontier_plans, CachedProfiler* screen) {
  WorkloadEvaluation e;
  e.workload = w.name;
  e.gpus = w.cluster.gpus();
  e.job = job_shape(w);
  Planner planner(w, profiler, o, progress, screen);
  e.searches = planner.search_partitions();
  const Frontiers f = method_frontiers(w, planner);
  throw_if_interrupted();  // the replays below report no progress
  e.kareus_only = summary(f.at(Method::kKareus));
  e.perseus = summary(f.at(Method::kPerseus));
  e.nanobatch_perseus = summary(f.at(Method::kNanobatchPerseus));
  e.kareus_max_clock = summary(f.at(Method::kKareusMaxClock));
  e.megatron = max_throughput_point(summary(f.at(Method::kMegatron)));
  e.nanobatch = max_throughput_point(summary(f.at(Method::kNanobatch)));
  const GpuSpec& gpu = w.gpu();
  e.power_calibrated = gpu.power_calibrated;
  e.power_source = gpu.power_source;
  e.power_caveat = gpu.power_caveat();
  if (w.batch.nano_batches == 1) {
    e.notes.push_back(fmt::format(
        "micro-batch {} runs as one nano-batch, so nothing overlaps: Kareus planned the SM clock "
        "only (Perseus-style), and Nanobatching's rows equal Megatron-LM's and Perseus's; "
        "overlap needs a micro-batch of at least 2",
        w.batch.micro_batch));
  }
  const std::vector<Ref> merged = merge_kareus_frontier(f, e);
  compare_own_frontier(e);
  const Chosen chosen = operating_points(e);
  make_plans(w, planner, f, merged, chosen, e);
  if (collect_frontier_plans) e.frontier_plans = frontier_plans_json(f, merged);
  e.measured = planner.measurements();
  e.reused = planner.reused();
  const auto full_points =
      static_cast<std::size_t>(e.measured) + static_cast<std::size_t>(e.reused);
  e.profiling_cost =
      screen ? estimate_profiling_cost(full_points, w.cluster.gpus_per_node,
                                       static_cast<std::size_t>(planner.screen_measurements()),
                                       o.screening.window_s, o.screening.cooldown_s)
             : estimate_profiling_cost(full_points, w.cluster.gpus_per_node);
  return e;
}

}  // namespace

WorkloadEvaluation evaluate_workload(const Workload& w, CachedProfiler& profiler,
                                     const PlannerOptions& o, const PlannerProgress& progress,
                                     bool collect_frontier_plans, CachedProfiler* screen) {
  const auto t0 = std::chrono::steady_clock::now();
  PlannerOptions round_o = o;
  WorkloadEvaluation e;
  for (int round = 0;; ++round) {
    // The profilers remember every point, so a later round re-measures nothing it planned
    // from before; the counts and the cost are of the distinct points of all rounds.
    e = evaluate_once(w, profiler, round_o, progress, collect_frontier_plans, screen);
    bool grew = false;
    if (round < o.focus_rounds) {
      for (const auto& [name, plan] : e.plans) grew = add_focus_clocks(round_o, plan) || grew;
    }
    if (!grew) break;
  }
  e.focus_clocks_mhz = round_o.focus_clocks_mhz;
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
nlohmann::json point_json(const FrontierSummaryPoint& p, const WorkloadEvaluation& e,
                          const std::string& label) {
  return {{"iteration_time_s", p.iteration_time_s},
          {"energy_j", p.energy_j},
          {"method", p.method},
          {"label", label},
          {"metrics", to_json(e.metrics(p))}};
}
// Kareus's own frontier against the baselines, before any fallback.
nlohmann::json own_frontier_json(const WorkloadEvaluation& e) {
  nlohmann::json own;
  own["iso_time_s"] = e.own_has_iso_time ? nlohmann::json(e.own_iso_time_point.iteration_time_s)
                                         : nlohmann::json(nullptr);
  own["iso_time_energy_j"] =
      e.own_has_iso_time ? nlohmann::json(e.own_iso_time_point.energy_j) : nlohmann::json(nullptr);
  own["iso_time_energy_saving_pct"] = e.own_has_iso_time
                                          ? nlohmann::json(e.own_iso_time_energy_saving_pct)
                                          : nlohmann::json(nullptr);
  own["iso_time_note"] = e.iso_time_note;
  own["losses"] = nlohmann::json::array();
  for (const auto& l : e.own_losses) {
    own["losses"].push_back({{"baseline", l.baseline},
                             {"deadlines", l.deadlines},
                             {"lost", l.lost},
                             {"worst_excess_pct", l.worst_excess_pct},
                             {"from_s", l.from_s},
                             {"to_s", l.to_s}});
  }
  return own;
}
nlohmann::json profiling_json(const WorkloadEvaluation& e) {
  nlohmann::json j = {{"points", e.measured + e.reused},
                      {"measured", e.measured},
                      {"reused", e.reused},
                      {"cost_estimate", e.profiling_cost.to_json()}};
  if (!e.focus_clocks_mhz.empty()) j["focus_clocks_mhz"] = e.focus_clocks_mhz;
  for (const auto& s : e.searches) {
    nlohmann::json pj = {{"key", s.key},
                         {"space", s.space},
                         {"evaluations", s.evaluations},
                         {"coverage_points", s.coverage_points},
                         {"prior", s.prior},
                         {"prior_seeded", s.prior_seeded}};
    if (s.screened) pj["confirmed"] = s.confirmed;  // evaluations were screening measurements
    if (s.completion_points > 0) pj["completion_points"] = s.completion_points;
    if (s.focus_points > 0) pj["focus_points"] = s.focus_points;
    j["partitions"].push_back(std::move(pj));
  }
  return j;
}
nlohmann::json replay_json(const WorkloadEvaluation& e) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : e.replays) {
    const auto plan = e.plans.find(r.plan);
    j.push_back({{"plan", r.plan},
                 {"label", plan == e.plans.end() ? "" : plan->second.label},
                 {"predicted_time_s", r.predicted_time_s},
                 {"emulated_time_s", r.emulated_time_s},
                 {"predicted_energy_j", r.predicted_energy_j},
                 {"emulated_energy_j", r.emulated_energy_j},
                 {"time_error", r.time_error()},
                 {"energy_error", r.energy_error()}});
  }
  return j;
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
  j["kareus_labels"] = nlohmann::json::array();
  for (const auto& p : e.kareus) j["kareus_labels"].push_back(kareus_plan_label(p.method));
  j["kareus_without_fallback"] = points_json(e.kareus_only);
  j["own_frontier"] = own_frontier_json(e);
  j["notes"] = e.notes;
  j["power_model"] = {{"calibrated", e.power_calibrated}, {"source", e.power_source}};
  j["perseus"] = points_json(e.perseus);
  j["nanobatch_perseus"] = points_json(e.nanobatch_perseus);
  j["kareus_max_clock"] = points_json(e.kareus_max_clock);
  j["megatron"] = {{"iteration_time_s", e.megatron.iteration_time_s},
                   {"energy_j", e.megatron.energy_j},
                   {"metrics", to_json(e.metrics(e.megatron))}};
  j["nanobatch"] = {{"iteration_time_s", e.nanobatch.iteration_time_s},
                    {"energy_j", e.nanobatch.energy_j},
                    {"metrics", to_json(e.metrics(e.nanobatch))}};
  j["operating_points"] = {
      {"perseus_fastest", point_json(e.perseus_fastest, e, "Perseus")},
      {"perseus_min_energy", point_json(e.perseus_min_energy, e, "Perseus")},
      {"kareus_iso_time",
       point_json(e.iso_time_point, e, kareus_plan_label(e.iso_time_point.method))},
      {"kareus_iso_energy",
       point_json(e.iso_energy_point, e, kareus_plan_label(e.iso_energy_point.method))}};
  j["job"] = to_json(e.job);  // what the metrics divide by
  j["plan_metrics"] = nlohmann::json::object();
  for (const auto& [name, p] : e.plans) {
    j["plan_metrics"][name] = to_json(throughput_metrics(e.job, p.iteration_time_s, p.energy_j));
  }
  j["profiling"] = profiling_json(e);
  if (!e.replays.empty()) j["replay"] = replay_json(e);
  if (with_plans) {
    for (const auto& [name, p] : e.plans) j["plans"][name] = p.to_json();
  }
  j["seconds"] = e.seconds;
  return j;
}

}  // namespace kareus
