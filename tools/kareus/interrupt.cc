// The CLI's SIGINT/SIGTERM handling (interrupt.h). The handler only stores the signal in a
// lock-free atomic (request_interrupt) and writes a fixed line with write(2): both
// async-signal-safe. The work stops at the next throw_if_interrupted() (before a measurement,
// at a progress step), unwinds normally and reaches main as Interrupted.
#include "interrupt.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <mutex>
#include <optional>

#include "kareus/interrupt.h"
#include "kareus/store.h"

namespace kareus::cli {
namespace {

void on_signal(int sig) {
  const int saved_errno = errno;
  request_interrupt(sig);
  static constexpr char kNotice[] =
      "\nkareus: stopping at the next step (a measurement in flight is not kept; a second signal "
      "stops at once)\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kNotice, sizeof kNotice - 1);
  errno = saved_errno;
}

std::once_flag g_install_once;
std::mutex g_mu;
std::optional<std::string> g_store_path;  // guarded by g_mu
std::size_t g_store_rows_at_open = 0;     // guarded by g_mu

}  // namespace

void install_interrupt_handlers() {
  std::call_once(g_install_once, [] {
    for (int sig : {SIGINT, SIGTERM}) {
      struct sigaction previous = {};
      if (::sigaction(sig, nullptr, &previous) != 0) continue;
      // A shell's `cmd &` ignores SIGINT for background jobs: keep that.
      if ((previous.sa_flags & SA_SIGINFO) == 0 && previous.sa_handler == SIG_IGN) continue;
      struct sigaction ours = {};
      ours.sa_handler = on_signal;
      sigemptyset(&ours.sa_mask);
      // SA_RESETHAND: the handler runs once, the next signal gets the default (terminate).
      ours.sa_flags = SA_RESTART | SA_RESETHAND;
      ::sigaction(sig, &ours, nullptr);
    }
  });
}

void note_profile_store(const std::string& path, std::size_t measurements) {
  std::lock_guard lock(g_mu);
  if (g_store_path) return;
  g_store_path = path;
  g_store_rows_at_open = measurements;
}

std::string interrupted_message(const Interrupted& e) {
  std::optional<std::string> path;
  std::size_t before = 0;
  {
    std::lock_guard lock(g_mu);
    path = g_store_path;
    before = g_store_rows_at_open;
  }
  if (!path) {
    return fmt::format(
        "{}: nothing was kept: without --db measurements live in memory only; run with --db "
        "PATH (e.g. --db out/profiles.db) to commit each measurement as it is taken, so that "
        "a rerun with the same --db resumes where an interrupted run stopped",
        e.what());
  }
  std::size_t kept = 0;
  try {
    kept = ProfileStore(*path).count_all();  // every session has closed it by now
  } catch (const std::exception& err) {
    return fmt::format(
        "{}: could not count the measurements kept in {} ({}); rerun the same "
        "command with --db {} to resume",
        e.what(), *path, err.what(), *path);
  }
  const std::size_t added = kept >= before ? kept - before : 0;
  return fmt::format(
      "{}: {} measurement{} kept in {} ({} taken by this run); rerun the same command with "
      "--db {} to resume (stored measurements are not taken again)",
      e.what(), kept, kept == 1 ? "" : "s", *path, added, *path);
}

}  // namespace kareus::cli
