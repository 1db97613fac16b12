// `--mpi` (docs/scale.md): every rank parses the same command line; rank 0 then runs the verb
// with a Coordinator that the verb's profiling session measures through, and the other ranks
// only serve measurements (distributed::run_worker) and print nothing.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <memory>

#include "commands.h"
#include "kareus/distributed.h"
#include "profiling_flags.h"

namespace kareus::cli {

/// True when the parsed verb (or a verb inside it) was given --mpi.
inline bool mpi_requested(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (const CLI::Option* o = sub->get_option_no_throw("--mpi"); o && o->count() > 0) return true;
    if (mpi_requested(*sub)) return true;
  }
  return false;
}

/// Wraps the parsed verb's action for an MPI job when --mpi was given; otherwise leaves it.
/// MPI starts (the plugin loads) only inside the wrapped action, so errors reach main's
/// handlers and a run without --mpi never touches MPI.
inline void wrap_for_mpi(const CLI::App& app, int& argc, char**& argv, Action& action) {
  if (!action || !mpi_requested(app)) return;
  action = [verb = action, &argc, &argv] {
    std::unique_ptr<distributed::Transport> t = distributed::open_mpi_transport(argc, argv);
    if (t->rank() != 0) {
      distributed::run_worker(*t);
      return 0;
    }
    distributed::Coordinator coord(*t);
    mpi_coordinator = &coord;
    try {
      const int rc = verb();
      mpi_coordinator = nullptr;
      coord.shutdown();
      const std::vector<int> per = coord.points_per_worker();
      int total = 0;
      for (int n : per) total += n;
      std::cerr << fmt::format(
          "kareus: --mpi: {} point(s) measured by {} rank(s) (per rank: {}), {:.1f} s waiting "
          "for measurements\n",
          total, per.size(), fmt::join(per, "/"), coord.measure_seconds());
      return rc;
    } catch (...) {
      mpi_coordinator = nullptr;
      coord.shutdown();  // workers finish; rank 0 reports the error
      throw;
    }
  };
}

}  // namespace kareus::cli
