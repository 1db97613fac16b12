// SIGINT/SIGTERM for the verbs that measure (profile, search, frontier, plan, optimize, eval):
// the first signal asks the run to stop between two measurements (kareus/interrupt.h), main
// says what the profile store kept and how to resume, and exits 128 + signal (130, 143); a
// second signal ends the process at once (every finished measurement is committed anyway).
#pragma once

#include <cstddef>
#include <string>

#include "kareus/error.h"

namespace kareus::cli {

/// Installs the handlers (once; later calls do nothing). Called by open_profiling, so verbs
/// that never poll the flag keep the default disposition and stop at once.
void install_interrupt_handlers();

/// Records the profile store a run measures into and the measurements it held when the run
/// first opened it (the first call per run counts; thread-safe).
void note_profile_store(const std::string& path, std::size_t measurements);

/// The message main prints for an interrupted run: how many measurements the store keeps and
/// the command that resumes, or, without --db, that nothing was kept and how to keep it.
std::string interrupted_message(const Interrupted& e);

}  // namespace kareus::cli
