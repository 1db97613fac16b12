// Cooperative interruption of long work (profiling, searching, planning). A signal handler (the
// CLI installs one for SIGINT and SIGTERM) calls request_interrupt(); the long loops call
// throw_if_interrupted() between steps: CachedProfiler around every new measurement, the CLI's
// progress callbacks at every step of every planning stage. So an interrupted run stops between
// two measurements, with every finished one committed to the profile store, and unwinds
// normally (locked clocks reset, files closed) before main turns Interrupted into 128 + signal.
#pragma once

namespace kareus {

/// Records that `signal` asked the run to stop. Async-signal-safe (one lock-free atomic store);
/// the first signal is kept.
void request_interrupt(int signal) noexcept;

/// The signal that asked the run to stop, or 0.
int interrupt_requested() noexcept;

/// Throws Interrupted (kareus/error.h) when a stop was requested.
void throw_if_interrupted();

/// Forgets a request (tests, or a caller that handled it).
void clear_interrupt() noexcept;

}  // namespace kareus
