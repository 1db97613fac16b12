// Frontier-level check of cheap profiles, scored by truth. The search benchmark
// (search_efficiency) scores each partition's recommended front; what a user runs is one plan
// composed from every partition's profile, so a small miss on one partition may matter more or
// less than its hypervolume says. For each paper workload this plans twice:
//   truth: every configuration measured exactly (exhaustive search, emulator noise 0);
//   cheap: the profile a user would pay for (mbo at --budget points per partition under the
//          measured noise, optionally screened with --screen-window-s windows, screening.h;
//          --strategy exhaustive measures every configuration once: the floor of any search
//          under that noise; --noise sets the cheap profile's energy noise, e.g. the measured
//          1% / sqrt(r) for r repeats averaged, whose cost the GPU-hours do not include),
// with --focus-rounds R planning up to R more times, each after measuring every partition's
// predicted front at the clocks the iso-time plan runs (PlannerOptions::focus_clocks_mhz, as
// `kareus plan --deadline --focus-rounds` does; its GPU-hours included),
// and takes, from each merged Kareus frontier (merge_with_fallbacks, as `kareus optimize`), the
// iso-time point: the least predicted energy within the deadline, which is the true Perseus
// fastest iteration time (the same deadline for both). Each chosen plan is replayed by the
// noise-free whole-iteration emulation, and the cheap plan's true energy is compared with the
// truth plan's; its true time is checked against the deadline. The profiling cost of each run
// (GPU-hours on real GPUs, profiling_cost.h) is printed beside today's default (mbo at 224
// points, 5 s windows, under the same noise), whose plan is scored the same way. Each profile
// ends with its mean excess over the seeds and that mean's standard error across them.
//
// Usage: frontier_truth [--budget N] [--strategy NAME] [--noise REL] [--seeds N]
//          [--screen-window-s S] [--filter SUB[,SUB]] [--clock-completion] [--no-smooth-sweeps]
//          [--sweep-stride N] [--focus-rounds N] [--focus-points K]
//          [--stop-threshold X] [--choice-pseudo-count X]
//          [--stop-patience N] [--threads N] [--skip-today] [--json FILE]
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "bench_cli.h"
#include "kareus/emulator.h"
#include "kareus/evaluate.h"
#include "kareus/frontier_file.h"
#include "kareus/planner.h"
#include "kareus/profiling_cost.h"
#include "kareus/screening.h"

namespace {

// Issue 33's frontier-level target: the cheap plan within 0.5% of the exhaustive plan's energy.
constexpr double kWithin = 0.005;

struct Scored {
  double planned_time_s = 0, planned_energy_j = 0;  ///< the planner's prediction
  double true_time_s = 0, true_energy_j = 0;        ///< the noise-free replay
  std::string label;                                ///< which method's plan
  double gpu_hours = 0;                             ///< profiling cost on real GPUs
  double deadline_s = 0;                            ///< truth run: Perseus's fastest time
};

struct Profile {
  int budget = 224;
  std::string strategy = "mbo";
  double noise = kareus::kMeasuredNoiseRel.energy;
  double screen_window_s = 0;
  bool clock_completion = false;
  bool smooth_sweeps = kareus::PlannerOptions{}.smooth_sweeps;
  int sweep_stride = kareus::PlannerOptions{}.sweep_stride;
  double stop_threshold = 0;  ///< mbo's stop rule (SearchOptions), 0: off
  int focus_rounds = 0;       ///< plan-directed profiling rounds (PlannerOptions::focus_clocks_mhz)
  int focus_points = kareus::PlannerOptions{}.focus_points_per_clock;
  int stop_patience = kareus::SearchOptions{}.stop_patience;
  double choice_pseudo_count = kareus::SearchOptions{}.choice_pseudo_count;
  std::uint64_t seed = 1;
};

// Plans `w` from the profile `pr` and scores its iso-time plan for `deadline_s` by truth (a
// deadline <= 0: Perseus's fastest on this run's own frontier, the truth run's case).
Scored plan_and_score(const kareus::Workload& w, const Profile& pr, double deadline_s) {
  using kareus::Method;
  kareus::ProfilerOptions po;
  po.gpu = w.gpu_name;
  po.noise = pr.noise;
  po.time_noise = pr.noise == 0 ? 0 : -1;
  po.seed = pr.seed;
  kareus::EmulatorProfiler full_backend(po);
  kareus::CachedProfiler full(full_backend, nullptr);
  kareus::PlannerOptions o;
  o.strategy = pr.strategy;
  o.search.budget = pr.budget;
  o.search.seed = pr.seed;
  o.search.stop_threshold = pr.stop_threshold;
  o.search.stop_patience = pr.stop_patience;
  o.search.choice_pseudo_count = pr.choice_pseudo_count;
  o.clock_completion = pr.clock_completion;
  o.smooth_sweeps = pr.smooth_sweeps;
  o.sweep_stride = pr.sweep_stride;
  std::unique_ptr<kareus::EmulatorProfiler> screen_backend;
  std::unique_ptr<kareus::CachedProfiler> screen;
  if (pr.screen_window_s > 0) {
    o.screening.window_s = pr.screen_window_s;
    o.screening.cooldown_s = pr.screen_window_s;
    kareus::ProfilerOptions so = po;
    so.window_s = pr.screen_window_s;
    so.cooldown_s = pr.screen_window_s;
    screen_backend = std::make_unique<kareus::EmulatorProfiler>(so);
    screen = std::make_unique<kareus::CachedProfiler>(*screen_backend, nullptr);
  }
  o.focus_points_per_clock = pr.focus_points;
  Scored s;
  std::unique_ptr<kareus::Planner> planner;
  kareus::Plan plan;
  for (int round = 0; round <= pr.focus_rounds; ++round) {
    planner =
        std::make_unique<kareus::Planner>(w, full, o, kareus::PlannerProgress{}, screen.get());
    std::map<Method, kareus::MethodFrontier> f;
    for (Method m : {Method::kKareus, Method::kPerseus, Method::kNanobatchPerseus})
      f[m] = planner->frontier(m);
    const auto& perseus = f.at(Method::kPerseus).points;
    s.deadline_s = deadline_s > 0 ? deadline_s
                                  : perseus[kareus::max_throughput_index(
                                                perseus, [](const auto& p) { return p.time_s; },
                                                [](const auto& p) { return p.energy_j; })]
                                        .time_s;
    const std::vector<kareus::FrontierRef> merged = kareus::merge_with_fallbacks(f);
    const kareus::FrontierRef* best = nullptr;
    const kareus::FrontierRef* fastest = nullptr;
    for (const auto& r : merged) {
      const auto& p = f.at(r.method).points[r.index];
      if (!fastest || p.time_s < f.at(fastest->method).points[fastest->index].time_s) fastest = &r;
      if (p.time_s <= s.deadline_s &&
          (!best || p.energy_j < f.at(best->method).points[best->index].energy_j))
        best = &r;
    }
    if (!best) best = fastest;  // no plan meets the deadline: the fastest one
    plan = planner->make_plan(f.at(best->method), best->index, "iso-time");
    s.label = kareus::kareus_plan_label(kareus::to_string(best->method));
    if (round == pr.focus_rounds || !kareus::add_focus_clocks(o, plan)) break;
  }
  const kareus::EmulatorModel truth(w.gpu());
  const kareus::IterationResult rep = kareus::emulate_iteration(
      w, truth, plan.execution,
      [&plan](int st, kareus::InstructionKind k, int mb) { return plan.settings(st, k, mb); },
      plan.clock_switch_s);
  s.planned_time_s = plan.iteration_time_s;
  s.planned_energy_j = plan.energy_j;
  s.true_time_s = rep.iteration_time_s;
  s.true_energy_j = rep.energy_j;
  const auto full_points = static_cast<std::size_t>(full.measured() + full.reused());
  const kareus::ProfilingCostEstimate cost =
      screen ? kareus::estimate_profiling_cost(
                   full_points, w.cluster.gpus_per_node,
                   static_cast<std::size_t>(planner->screen_measurements()), o.screening.window_s,
                   o.screening.cooldown_s)
             : kareus::estimate_profiling_cost(full_points, w.cluster.gpus_per_node);
  s.gpu_hours = cost.gpu_hours();
  return s;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    const std::size_t b = std::min(s.find(',', a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

int run(int argc, char** argv) {
  Profile cheap;
  cheap.budget = 56;
  int seeds = 3, threads = 1;
  bool skip_today = false;  // the default's column is the same for every cheap profile
  std::string filter, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--budget")
      cheap.budget = kareus::bench::flag_int(a, next());
    else if (a == "--strategy")
      cheap.strategy = next();
    else if (a == "--noise")
      cheap.noise = kareus::bench::flag_double(a, next());
    else if (a == "--seeds")
      seeds = kareus::bench::flag_int(a, next());
    else if (a == "--screen-window-s")
      cheap.screen_window_s = kareus::bench::flag_double(a, next());
    else if (a == "--clock-completion")
      cheap.clock_completion = true;
    else if (a == "--no-smooth-sweeps")
      cheap.smooth_sweeps = false;
    else if (a == "--sweep-stride")
      cheap.sweep_stride = kareus::bench::flag_int(a, next());
    else if (a == "--skip-today")
      skip_today = true;
    else if (a == "--stop-threshold")
      cheap.stop_threshold = kareus::bench::flag_double(a, next());
    else if (a == "--focus-rounds")
      cheap.focus_rounds = kareus::bench::flag_int(a, next());
    else if (a == "--focus-points")
      cheap.focus_points = kareus::bench::flag_int(a, next());
    else if (a == "--stop-patience")
      cheap.stop_patience = kareus::bench::flag_int(a, next());
    else if (a == "--choice-pseudo-count")
      cheap.choice_pseudo_count = kareus::bench::flag_double(a, next());
    else if (a == "--filter")
      filter = next();
    else if (a == "--threads")
      threads = kareus::bench::flag_int(a, next());
    else if (a == "--json")
      json_path = next();
    else {
      fmt::print(
          stderr,
          "usage: frontier_truth [--budget N] [--strategy NAME] [--noise REL] [--seeds N] "
          "[--screen-window-s S] [--clock-completion] [--no-smooth-sweeps] [--sweep-stride N] "
          "[--focus-rounds N] [--focus-points K] "
          "[--stop-threshold X] [--choice-pseudo-count X] "
          "[--stop-patience N] [--filter SUB[,SUB]] [--threads N] [--skip-today] "
          "[--json FILE]\n");
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<kareus::Workload> workloads;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KAREUS_SOURCE_DIR) + "/workloads/paper")) {
    if (e.path().extension() != ".yaml") continue;
    const std::string name = e.path().stem().string();
    bool keep = filter.empty();
    for (const auto& sub : split(filter)) keep = keep || name.find(sub) != std::string::npos;
    if (keep) workloads.push_back(kareus::load_workload(e.path().string()));
  }
  std::sort(workloads.begin(), workloads.end(),
            [](const auto& x, const auto& y) { return x.name < y.name; });

  struct Row {
    Scored truth;
    std::vector<Scored> cheap, today;  // per seed
  };
  std::vector<Row> rows(workloads.size());
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  auto worker = [&] {
    for (std::size_t i = next++; i < workloads.size(); i = next++) {
      const auto& w = workloads[i];
      Profile exact;
      exact.strategy = "exhaustive";
      exact.noise = 0;
      Row r;
      r.truth = plan_and_score(w, exact, 0);
      for (int s = 1; s <= seeds; ++s) {
        Profile c = cheap;
        c.seed = static_cast<std::uint64_t>(s);
        r.cheap.push_back(plan_and_score(w, c, r.truth.deadline_s));
        if (skip_today) continue;
        Profile t;
        t.seed = static_cast<std::uint64_t>(s);
        r.today.push_back(plan_and_score(w, t, r.truth.deadline_s));
      }
      std::lock_guard<std::mutex> lock(mu);
      double worst = 0;
      for (const auto& c : r.cheap)
        worst = std::max(worst, c.true_energy_j / r.truth.true_energy_j);
      fmt::print(stderr, "{:<36} worst cheap/truth energy {:+.3f}%\n", w.name, 100 * (worst - 1));
      rows[i] = std::move(r);
    }
  };
  kareus::bench::run_workers(threads, worker);

  std::string cheap_name = cheap.strategy == "exhaustive"
                               ? std::string("exhaustive (every configuration once)")
                               : fmt::format("{} {} points", cheap.strategy, cheap.budget);
  if (cheap.screen_window_s > 0)
    cheap_name += fmt::format(" screened at {:g} s", cheap.screen_window_s);
  if (cheap.noise != kareus::kMeasuredNoiseRel.energy)
    cheap_name += fmt::format(" at energy noise {:g}", cheap.noise);
  if (cheap.clock_completion) cheap_name += " + clock completion";
  if (cheap.focus_rounds > 0)
    cheap_name += fmt::format(" + {} focus rounds ({} points per clock)", cheap.focus_rounds,
                              cheap.focus_points);
  if (!cheap.smooth_sweeps) cheap_name += " without smoothed sweeps";
  if (cheap.smooth_sweeps)
    cheap_name += fmt::format(", sweeps from every {} clocks", cheap.sweep_stride);
  if (cheap.stop_threshold > 0)
    cheap_name += fmt::format(" stopped at gain < {:g} over {} batches", cheap.stop_threshold,
                              cheap.stop_patience);
  fmt::print(
      "iso-time plans scored by truth: deadline = true Perseus fastest; cheap = {}, today "
      "= mbo 224 points at 5 s; {} seeds; energy excess over the exhaustive noise-free "
      "plan (mean, worst), true time over the deadline (worst), GPU-hours\n",
      cheap_name, seeds);
  fmt::print("{:<36} {:>9} {:>10} {:>17} {:>10} {:>9} {:>17} {:>10} {:>9}\n", "workload",
             "deadline", "truth J", "cheap dE mean/max", "cheap dT", "cheap GPUh",
             "today dE mean/max", "today dT", "today GPUh");
  double worst_cheap = -1e9, worst_today = -1e9, sum_cheap_h = 0, sum_today_h = 0;
  nlohmann::json j = nlohmann::json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    auto stats = [&](const std::vector<Scored>& v, double& worst_e, double& worst_t,
                     double& hours) {
      double mean_e = 0;
      if (v.empty()) {  // --skip-today
        worst_e = worst_t = hours = 0;
        return 0.0;
      }
      worst_e = -1e9;
      worst_t = -1e9;
      hours = 0;
      for (const auto& s : v) {
        const double de = s.true_energy_j / r.truth.true_energy_j - 1;
        mean_e += de / static_cast<double>(v.size());
        worst_e = std::max(worst_e, de);
        worst_t = std::max(worst_t, s.true_time_s / r.truth.deadline_s - 1);
        hours += s.gpu_hours / static_cast<double>(v.size());
      }
      return mean_e;
    };
    double ce, ct, ch, te, tt, th;
    const double cm = stats(r.cheap, ce, ct, ch);
    const double tm = stats(r.today, te, tt, th);
    worst_cheap = std::max(worst_cheap, ce);
    worst_today = std::max(worst_today, te);
    sum_cheap_h += ch;
    sum_today_h += th;
    fmt::print(
        "{:<36} {:>8.3f}s {:>10.1f} {:>+7.3f}%/{:>+7.3f}% {:>+9.3f}% {:>9.2f}  "
        "{:>+7.3f}%/{:>+7.3f}% {:>+9.3f}% {:>9.2f}\n",
        workloads[i].name, r.truth.deadline_s, r.truth.true_energy_j, 100 * cm, 100 * ce, 100 * ct,
        ch, 100 * tm, 100 * te, 100 * tt, th);
    auto runs = [](const std::vector<Scored>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& s : v)
        a.push_back({{"true_time_s", s.true_time_s},
                     {"true_energy_j", s.true_energy_j},
                     {"planned_time_s", s.planned_time_s},
                     {"planned_energy_j", s.planned_energy_j},
                     {"plan", s.label},
                     {"gpu_hours", s.gpu_hours}});
      return a;
    };
    j.push_back({{"workload", workloads[i].name},
                 {"deadline_s", r.truth.deadline_s},
                 {"truth",
                  {{"true_time_s", r.truth.true_time_s},
                   {"true_energy_j", r.truth.true_energy_j},
                   {"plan", r.truth.label}}},
                 {"cheap", runs(r.cheap)},
                 {"today", runs(r.today)}});
  }
  fmt::print(
      "worst energy excess: cheap {:+.3f}%, today {:+.3f}%; profiling: cheap {:.1f} "
      "GPU-hours, today {:.1f} GPU-hours over the {} workloads ({:.1f}% of today)\n",
      100 * worst_cheap, 100 * worst_today, sum_cheap_h, sum_today_h, rows.size(),
      sum_today_h > 0 ? 100 * sum_cheap_h / sum_today_h : 0.0);
  // Why per seed: the workloads are fixed and the seeds are the draws, so the mean's
  // uncertainty is how much the suite's mean moves from one seed's profiles to the next (on 14
  // workloads x 6 seeds of the cheap profile about 0.07%: variants closer than that are not told
  // apart by 3 seeds).
  auto summary = [&](const char* name, const std::vector<Scored> Row::*runs) {
    const std::size_t n_seeds = rows.empty() ? 0 : (rows.front().*runs).size();
    if (n_seeds == 0) return;
    std::vector<double> seed_mean(n_seeds, 0.0);
    int within_runs = 0, within_workloads = 0;
    for (const Row& r : rows) {
      bool all = true;
      for (std::size_t s = 0; s < n_seeds; ++s) {
        const double de = (r.*runs)[s].true_energy_j / r.truth.true_energy_j - 1;
        seed_mean[s] += de / static_cast<double>(rows.size());
        within_runs += de <= kWithin ? 1 : 0;
        all = all && de <= kWithin;
      }
      within_workloads += all ? 1 : 0;
    }
    double mean = 0, ss = 0;
    for (double m : seed_mean) mean += m / static_cast<double>(n_seeds);
    for (double m : seed_mean) ss += (m - mean) * (m - mean);
    const double se =
        n_seeds > 1 ? std::sqrt(ss / static_cast<double>(n_seeds - 1) / n_seeds) : 0.0;
    std::string per_seed;
    for (double m : seed_mean)
      per_seed += fmt::format("{}{:+.3f}%", per_seed.empty() ? "" : " ", 100 * m);
    fmt::print(
        "{}: mean energy excess {:+.3f}% (standard error over the {} seeds {:.3f}%; per seed {}); "
        "within {:g}%: {} of {} workloads on every seed, {} of {} runs\n",
        name, 100 * mean, n_seeds, 100 * se, per_seed, 100 * kWithin, within_workloads, rows.size(),
        within_runs, rows.size() * n_seeds);
  };
  summary("cheap", &Row::cheap);
  summary("today", &Row::today);
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kareus::bench::guarded_main("frontier_truth", [&] { return run(argc, argv); });
}
