// Flags shared by the verbs that run the planning pipeline (frontier, plan, optimize).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "kareus/planner.h"
#include "kareus/progress.h"
#include "profiling_flags.h"

namespace kareus::cli {

struct PlannerFlags {
  ProfilingFlags profiling;
  PlannerOptions planner;
  bool quiet = false;
};

inline void add_planner_flags(CLI::App* cmd, PlannerFlags& f) {
  cmd->add_option("--strategy", f.planner.strategy, "partition search: mbo, random, exhaustive")
      ->capture_default_str();
  cmd->add_option("--budget", f.planner.search.budget, "measurements per partition")
      ->capture_default_str();
  cmd->add_option("--seed", f.planner.search.seed, "seed of the search")->capture_default_str();
  cmd->add_option("--unit", f.planner.unit_s, "frontier solver time unit in seconds")
      ->capture_default_str();
  cmd->add_flag("--per-layer", f.planner.per_layer,
                "let each layer pick its own partition configuration where that is better");
  cmd->add_option_function<double>(
         "--min-clock-hold-ms", [&f](double ms) { f.planner.min_clock_hold_s = ms * 1e-3; },
         "keep each SM clock at least this long (ms of instruction time); shorter runs of one "
         "clock merge into a neighbouring, faster run (default 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option_function<double>(
         "--clock-switch-ms", [&f](double ms) { f.planner.clock_switch_s = ms * 1e-3; },
         "stall per SM-clock change in every prediction (default: the GPU's catalogue value; "
         "0: changes are free, the paper's model)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--quiet", f.quiet, "no progress display");
  add_profiling_flags(cmd, f.profiling);
}

/// Progress of a pipeline run: one bar per stage, on stderr.
class PipelineProgress {
 public:
  explicit PipelineProgress(bool enabled) : enabled_(enabled) {}
  PlannerProgress callback() {
    return [this](const std::string& stage, std::size_t done, std::size_t total) {
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
