// Entry point of the `kareus` CLI. The only place that turns errors into exit codes:
// 0 success, 1 internal error, 2 invalid input (bad file, flag or database), 128 + signal after
// SIGINT/SIGTERM (130, 143; interrupt.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"
#include "interrupt.h"
#include "kareus/error.h"
#include "mpi_run.h"

namespace {

// Parses the command line and runs the chosen verb; errors that end the run propagate to main.
int run(int argc, char** argv) {
  CLI::App app{
      "Kareus: joint frequency, SM-allocation and launch-timing planning that cuts the energy "
      "and time of large-model training.",
      "kareus"};  // a fixed name: help reads the same wherever the binary lives (docs/cli.md)
  app.require_subcommand(1);
  app.set_version_flag("--version", "kareus 0.1.0");
  kareus::cli::Action action;
  kareus::cli::register_workload(app, action);
  kareus::cli::register_profile(app, action);
  kareus::cli::register_search(app, action);
  kareus::cli::register_frontier(app, action);
  kareus::cli::register_plan(app, action);
  kareus::cli::register_optimize(app, action);
  kareus::cli::register_eval(app, action);
  kareus::cli::register_emulate(app, action);
  kareus::cli::register_calibrate(app, action);
  kareus::cli::register_monitor(app, action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  kareus::cli::wrap_for_mpi(app, argc, argv, action);  // --mpi: docs/scale.md
  return action ? action() : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kareus::InvalidInput& e) {
    std::fprintf(stderr, "kareus: error: %s\n", e.what());
    return 2;
  } catch (const kareus::Interrupted& e) {
    // After a SIGINT/SIGTERM: what the profile store kept and how to resume; 130 or 143.
    std::fprintf(stderr, "kareus: %s\n", kareus::cli::interrupted_message(e).c_str());
    return 128 + e.signal();
  } catch (const kareus::NotSupported& e) {
    std::fprintf(stderr, "kareus: not supported: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kareus: internal error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "kareus: internal error: unknown exception\n");
    return 1;
  }
}
