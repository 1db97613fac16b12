// Checks every verb applies to its flags before it loads, searches or profiles anything, and
// the paths of the data shipped with the source tree. A flag that cannot work must fail at once
// (exit 2, naming the flag, the value and what is allowed), not after a search of minutes.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kareus/error.h"
#include "kareus/workload.h"

namespace kareus::cli {

/// Formats a number for a message: 6 significant digits, so 1e308 never prints 309 digits.
inline std::string num(double v) { return fmt::format("{:.6g}", v); }

/// A CLI11 check that the value is a finite number in [lo, hi] (lo excluded when `strict_lo`);
/// nan, inf and out-of-range literals (1e999) are refused. `what` names the unit, e.g.
/// "seconds". Runs while the command line is parsed, so before any work.
inline CLI::Validator finite_in(double lo, bool strict_lo, double hi, const std::string& what) {
  const std::string allowed = fmt::format("a finite number of {} {} {} and <= {}", what,
                                          strict_lo ? ">" : ">=", num(lo), num(hi));
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        const bool parsed = end != s.c_str() && *end == '\0' && errno != ERANGE;
        if (parsed && std::isfinite(v) && (strict_lo ? v > lo : v >= lo) && v <= hi) return "";
        return fmt::format("'{}' is not allowed: {}", s, allowed);
      },
      strict_lo ? fmt::format("in ({},{}]", num(lo), num(hi))
                : fmt::format("in [{},{}]", num(lo), num(hi)));
}

/// A CLI11 check that the value is an integer in [lo, hi].
inline CLI::Validator integer_in(long long lo, long long hi, const std::string& what) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (end != s.c_str() && *end == '\0' && errno != ERANGE && v >= lo && v <= hi) return "";
        return fmt::format("'{}' is not allowed: an integer number of {} in {}..{}", s, what, lo,
                           hi);
      },
      fmt::format("in {}..{}", lo, hi));
}

/// What a verb writes at a path its command line names.
enum class OutputKind {
  kFile,              ///< a file, in an existing folder
  kFileWithSiblings,  ///< a file and files beside it (a plot's script and data), existing folder
  kStore,             ///< a profile store (SQLite: -wal, -shm beside it); missing folders created
  kFolder,            ///< a folder, created if missing; `inside` names what is written in it
};

/// The one check of every output path (--out, --db, --report, --png, --dump-dag, --ask,
/// --append), made before anything is loaded, searched or measured: the OS is asked whether
/// the file can be opened for writing and its folder (or, where folders are created, the
/// nearest existing one) takes new files, so a read-only or full-of-files place fails at once.
/// Throws InvalidInput naming the flag, the path, the OS's reason (strerror: "Permission
/// denied", "Read-only file system", "Not a directory", "Is a directory") and what is allowed.
/// Creates and changes nothing. `inside`: paths relative to a kFolder the verb writes (a
/// trailing '/' marks a folder); those that exist must be writable and of that kind.
/// (output_check.cc)
void check_output(const std::string& flag, const std::string& path, OutputKind kind,
                  const std::vector<std::string>& inside = {});

/// Creates the missing folders above `path` (a kStore); InvalidInput with the OS's reason.
void create_parent_folders(const std::string& flag, const std::string& path);

/// Refuses an input file that does not exist or is a directory.
inline void check_input_file(const std::string& flag, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) && !std::filesystem::is_fifo(path, ec)) {
    throw InvalidInput(fmt::format("{} {}: no such file", flag, path));
  }
}

/// A file or folder shipped with Kareus (workloads/, data/), found in the first of:
/// $KAREUS_DATA_DIR/rel; rel relative to the current directory; <binary>/../share/kareus/rel
/// (`cmake --install`, the wheel); the source tree, only for a binary still in its build
/// folder. None has it: the last candidate, so that the caller's check names a path.
/// (shipped_path.cc)
std::string shipped_path(const std::string& rel);

/// The line every text output with emulated energies ends with: whether the GPU's power model
/// is calibrated, and the caveat when it is not.
inline std::string power_model_text(const GpuSpec& g) {
  return g.power_calibrated ? fmt::format("power model: calibrated ({})\n", g.power_source)
                            : fmt::format("power model: NOT calibrated: {}\n", g.power_caveat());
}

/// Loads a workload file for a verb: refuses a job that does not fit its GPUs' memory (exit 2
/// with the figures) unless the file says `what_if: true`, and prints its warnings (e.g.
/// micro_batches < pp) on stderr.
inline Workload load_job(const std::string& path) {
  Workload w = load_workload(path);
  require_memory_fit(w);
  for (const auto& warning : workload_warnings(w)) {
    std::fprintf(stderr, "kareus: warning: %s\n", warning.c_str());
  }
  return w;
}

}  // namespace kareus::cli
