// The `kareus` CLI: each verb registers its subcommand and the action to run after parsing.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kareus::cli {

/// The action a verb runs once the command line is parsed; returns the exit code.
using Action = std::function<int()>;

void register_workload(CLI::App& app, Action& action);
void register_emulate(CLI::App& app, Action& action);
void register_calibrate(CLI::App& app, Action& action);
void register_profile(CLI::App& app, Action& action);
void register_search(CLI::App& app, Action& action);
void register_frontier(CLI::App& app, Action& action);
void register_plan(CLI::App& app, Action& action);
void register_optimize(CLI::App& app, Action& action);
void register_eval(CLI::App& app, Action& action);
void register_monitor(CLI::App& app, Action& action);

}  // namespace kareus::cli
