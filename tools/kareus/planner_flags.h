// Flags shared by the verbs that run the planning pipeline (frontier, plan, optimize).
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>

#include "cli_util.h"
#include "kareus/error.h"
#include "kareus/interrupt.h"
#include "kareus/planner.h"
#include "kareus/progress.h"
#include "kareus/search.h"
#include "profiling_flags.h"
#include "search_flags.h"

namespace kareus::cli {

/// `--per-layer`'s help with what it costs, measured with `kareus frontier --json` on
/// workloads/paper/llama3.2-3b_tp8_mbs8_seq4096.yaml (6.4 s and 50 MB without, 103 s and
/// 2.1 GB with; least energy 17188.2 J against 17187.6 J).
constexpr const char* kPerLayerHelp =
    "let each layer pick its own partition configuration where that is better; costs about "
    "16x the time and 40x the memory for about 0.003% less energy (llama3.2-3b paper "
    "workload)";

struct PlannerFlags {
  ProfilingFlags profiling;
  PlannerOptions planner;
  ScreeningFlags screening;
  bool quiet = false;
  bool sweep_stride_given = false;  ///< --sweep-stride was on the command line
};

inline void add_planner_flags(CLI::App* cmd, PlannerFlags& f) {
  cmd->add_option("--strategy", f.planner.strategy, "partition search: mbo, random, exhaustive")
      ->capture_default_str();
  add_search_flags(cmd, f.planner.search, "measurements per partition");
  cmd->add_option("--unit", f.planner.unit_s, "frontier solver time unit in seconds")
      ->capture_default_str()
      ->check(finite_in(1e-6, false, 60, "seconds"));
  cmd->add_flag("--per-layer", f.planner.per_layer, kPerLayerHelp);
  cmd->add_option_function<double>(
         "--min-clock-hold-ms", [&f](double ms) { f.planner.min_clock_hold_s = ms * 1e-3; },
         "keep each SM clock at least this long (ms of instruction time); shorter runs of one "
         "clock merge into a neighbouring, faster run (default 0)")
      ->check(finite_in(0, false, 1e6, "milliseconds"));
  cmd->add_option_function<double>(
         "--clock-switch-ms", [&f](double ms) { f.planner.clock_switch_s = ms * 1e-3; },
         "stall per SM-clock change in every prediction (default: the GPU's catalogue value; "
         "0: changes are free, the paper's model)")
      ->check(finite_in(0, false, 1e4, "milliseconds"));
  cmd->add_option("--frontier-memory-mb", f.planner.frontier_memory_mb,
                  "memory one method's frontier may take (MiB); over it, planning stops with "
                  "exit 2 before the solver runs")
      ->capture_default_str()
      ->check(finite_in(1, false, 1e9, "MiB"));
  cmd->add_flag("--complete-clocks", f.planner.clock_completion,
                "after each partition search, also measure every clock with the SM count and "
                "slot of the recommended points at the nearest clocks (about 4% more points at "
                "56 per partition; docs/search.md)");
  cmd->add_flag("--smooth-sweeps,!--no-smooth-sweeps", f.planner.smooth_sweeps,
                "smooth each one-point-per-clock sweep (segments, NCCL-default partitions) "
                "across the clocks at the measurement noise before composing; on by default "
                "(docs/search.md, \"Smoothed sweeps\")")
      ->capture_default_str();
  cmd->add_option_function<int>(
         "--sweep-stride",
         [&f](int n) {
           f.planner.sweep_stride = n;
           f.sweep_stride_given = true;
         },
         fmt::format("measure each smoothed sweep at every N-th clock from the fastest (and the "
                     "slowest), the smoother filling in the rest (default {})",
                     PlannerOptions{}.sweep_stride))
      ->check(CLI::Range(1, 64));
  cmd->add_option("--focus-rounds", f.planner.focus_rounds,
                  "plan-directed profiling: after planning, measure each partition's predicted "
                  "front at the clocks the plans run and plan again, up to this many times "
                  "(docs/search.md, \"Plan-directed profiling\")")
      ->capture_default_str()
      ->check(CLI::Range(0, 8));
  cmd->add_option("--focus-points", f.planner.focus_points_per_clock,
                  "with --focus-rounds: configurations measured per partition at each such clock")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--quiet", f.quiet, "no progress display");
  add_profiling_flags(cmd, f.profiling);
  add_screening_flags(cmd, f.screening);
  add_prior_flags(cmd, f.profiling);
}

/// The planner options with the session's prior (--warm-start, --prior) in its searches.
inline PlannerOptions planner_options(const PlannerFlags& f, const ProfilingSession& s) {
  PlannerOptions o = f.planner;
  o.search.prior = s.prior;
  return o;
}

/// The checks of the planner flags that CLI11 cannot make while parsing; run before anything
/// is loaded or measured.
inline void check_planner_flags(const PlannerFlags& f) {
  try {
    create_search_strategy(f.planner.strategy);
  } catch (const InvalidInput& e) {
    throw InvalidInput(fmt::format("--strategy {}: {}", f.planner.strategy, e.what()));
  }
  check_profiling_flags(f.profiling);
  if (f.screening.on()) screening_options(f.screening, f.profiling, false);
  if (f.sweep_stride_given && f.planner.sweep_stride > 1 && !f.planner.smooth_sweeps) {
    throw InvalidInput(fmt::format(
        "--sweep-stride {} needs smoothed sweeps, which fill in the clocks it skips: drop "
        "--no-smooth-sweeps or --sweep-stride",
        f.planner.sweep_stride));
  }
}

/// What the planning pipeline measures with: the full-window session and, with
/// --screen-window-s, the screening one next to it (same backend and store).
struct PlannerProfiling {
  ProfilingSession full;
  ScreeningSession screen;
  PlannerOptions options;  ///< the flags' planner options, with the prior and the screening
  CachedProfiler* screen_profiler() const { return screen.cached.get(); }
};

inline PlannerProfiling open_planner_profiling(const PlannerFlags& f, const Workload& w) {
  PlannerProfiling p;
  p.full = open_profiling(f.profiling, w);
  p.options = planner_options(f, p.full);
  if (f.screening.on()) {
    p.options.screening = screening_options(f.screening, f.profiling, false);
    p.screen = open_screening(f.profiling, w, p.full, p.options.screening);
  }
  return p;
}

/// Progress of a pipeline run: one bar per stage, on stderr. Each step also checks for a stop
/// request (kareus/interrupt.h), so planning stages without measurements stop too.
class PipelineProgress {
 public:
  explicit PipelineProgress(bool enabled) : enabled_(enabled) {}
  PlannerProgress callback() {
    return [this](const std::string& stage, std::size_t done, std::size_t total) {
      throw_if_interrupted();  // every step of every stage: SIGINT/SIGTERM stop here
      if (!enabled_) return;
      if (!bar_ || stage != stage_) {
        if (bar_) bar_->finish();
        stage_ = stage;
        bar_ = std::make_unique<Progress>(stage, total, true);
      }
      bar_->update(done);
      if (done >= total) {
        bar_->finish();
        bar_.reset();
        stage_.clear();
      }
    };
  }
  void finish() {
    if (bar_) bar_->finish();
    bar_.reset();
  }

 private:
  bool enabled_;
  std::string stage_;
  std::unique_ptr<Progress> bar_;
};

}  // namespace kareus::cli
