// The search's own flags (SearchOptions), shared by `kareus search` and the verbs that run the
// planning pipeline (frontier, plan, optimize, eval), so a schedule or stop rule measured with
// one verb is the one the others run.
#pragma once

#include <CLI/CLI.hpp>

#include "cli_util.h"
#include "kareus/search.h"

namespace kareus::cli {

/// `budget_help`: what --budget counts for the verb (one partition, or each of a workload's).
inline void add_search_flags(CLI::App* cmd, SearchOptions& o, const char* budget_help) {
  cmd->add_option("--budget", o.budget, budget_help)
      ->capture_default_str()
      ->check(integer_in(1, 1000000, "measurements"));
  cmd->add_option("--seed", o.seed, "seed of every random choice of the search")
      ->capture_default_str();
  cmd->add_option("--initial-points", o.initial_points,
                  "mbo: initial design points (not scaled with the budget)")
      ->capture_default_str()
      ->check(integer_in(1, 1000000, "points"));
  cmd->add_option("--batch-size", o.batch_size, "mbo: points per batch")
      ->capture_default_str()
      ->check(integer_in(1, 1000000, "points"));
  cmd->add_option("--initial-design", o.initial_design,
                  "mbo: lhs (Latin hypercube: every clock in the initial points) or random")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "lhs"}));
  cmd->add_option("--stop-threshold", o.stop_threshold,
                  "mbo: stop when --stop-patience batches in a row each add less than this "
                  "fraction of the measured hypervolume (0: off; docs/search.md)")
      ->capture_default_str()
      ->check(finite_in(0, false, 1, "hypervolume fraction"));
  cmd->add_option("--stop-patience", o.stop_patience,
                  "mbo: flat batches in a row that end the search (with --stop-threshold)")
      ->capture_default_str()
      ->check(integer_in(1, 1000, "batches"));
}

}  // namespace kareus::cli
