// Flags shared by every verb that measures: backend choice, profile store, emulator noise.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "interrupt.h"
#include "kareus/distributed.h"
#include "kareus/error.h"
#include "kareus/profiler.h"
#include "kareus/screening.h"
#include "kareus/search_prior.h"
#include "kareus/search_space.h"
#include "kareus/store.h"
#include "kareus/workload.h"

namespace kareus::cli {

struct ProfilingFlags {
  std::string backend = "emulator";
  std::string db;
  std::string trace;
  double noise = kMeasuredNoiseRel.energy;
  double time_noise = -1;
  std::uint64_t seed = 1;
  int delay_ms = 0;
  // Real GPUs (--backend cuda, docs/cuda.md).
  bool allow_clock_control = false;
  std::vector<int> devices;
  double window_s = 5.0;
  double cooldown_s = 5.0;
  bool mpi = false;  ///< distributed profiling: rank 0 searches, the other ranks measure
  // Warm starts (add_prior_flags; docs/search.md "Warm starts"), for the verbs that search.
  std::string warm_start = "store";  ///< "store" or "none"
  std::string prior = "auto";        ///< "emulator", "none" or "auto"
};

/// The largest CUDA device index --devices takes (NVML drives at most 64 GPUs per process; a
/// value beyond int would otherwise be refused without its limit).
constexpr long long kMaxCudaDeviceIndex = 1023;

/// Rank 0's coordinator when the job runs with --mpi (set by main), else null.
inline distributed::Coordinator* mpi_coordinator = nullptr;

inline void add_profiling_flags(CLI::App* cmd, ProfilingFlags& f) {
  cmd->add_option("--backend", f.backend, "profiling backend: emulator, trace, cuda")
      ->capture_default_str();
  cmd->add_option("--db", f.db, "profile store (SQLite); reused and extended across runs");
  cmd->add_option("--trace", f.trace, "CSV of measurements for --backend trace");
  cmd->add_option("--noise", f.noise,
                  "emulator: noise of a measured energy (relative std. dev.; an H200 repeats to "
                  "about 1%); 0: exact")
      ->capture_default_str()
      ->check(finite_in(0, false, 1, "relative standard deviation"));
  cmd->add_option("--time-noise", f.time_noise,
                  "emulator: noise of a measured time (an H200 repeats to about 0.1%); -1: 0.1 x "
                  "--noise")
      ->capture_default_str();
  cmd->add_option("--noise-seed", f.seed, "emulator noise seed")->capture_default_str();
  cmd->add_option("--emulate-profiling-delay-ms", f.delay_ms,
                  "wall time each emulated measurement takes, as real profiling would")
      ->capture_default_str()
      ->check(integer_in(0, 3600000, "milliseconds"));
  cmd->add_flag("--allow-clock-control", f.allow_clock_control,
                "cuda: lock SM clocks through NVML (needs root or admin-granted permission); "
                "without it, measure at the card's current clock only");
  cmd->add_option("--devices", f.devices,
                  "cuda: CUDA device indices of the partition's group, e.g. 0,1,2,3 (default: all)")
      ->delimiter(',')
      ->check(integer_in(0, kMaxCudaDeviceIndex, "device index"));
  cmd->add_option(
         "--window-s", f.window_s,
         "measurement window per point (s); the emulator's noise follows it (--noise is the 5 s "
         "figure)")
      ->capture_default_str()
      ->check(finite_in(0, true, 3600, "seconds"));
  cmd->add_option("--cooldown-s", f.cooldown_s, "cuda: cool-down after each point (s)")
      ->capture_default_str()
      ->check(finite_in(0, false, 3600, "seconds"));
  cmd->add_flag("--mpi", f.mpi,
                "distributed profiling under mpirun/srun: rank 0 searches and owns --db, the other "
                "ranks measure (docs/scale.md)");
}

/// When this process started (seconds since the epoch): the store prior reads only what the
/// store held then, so a run's warm starts do not depend on the order in which its searches,
/// or other processes sharing the store, measure.
inline const double kRunStartS =
    std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

/// The warm-start flags of the verbs that search (search, frontier, plan, optimize, eval).
inline void add_prior_flags(CLI::App* cmd, ProfilingFlags& f) {
  cmd->add_option("--warm-start", f.warm_start,
                  "mbo: start from the --db store's measurements of related partitions (the same "
                  "partition kind at other shapes), weighted by cross-validation on the "
                  "partition's own points: store, none")
      ->capture_default_str()
      ->check(CLI::IsMember({"store", "none"}));
  cmd->add_option("--prior", f.prior,
                  "mbo: the emulator's prediction of each configuration as a prior: emulator, "
                  "none, auto (emulator with --backend cuda or trace, else none); it takes the "
                  "place of --warm-start store")
      ->capture_default_str()
      ->check(CLI::IsMember({"emulator", "none", "auto"}));
}

/// The checks of the profiling flags that CLI11 cannot make while parsing; run before anything
/// is loaded or measured: --db must be writable where it is (or, its folders missing, where
/// they would be created). (The store itself is opened, and so checked, by open_profiling,
/// before any measurement.)
inline void check_profiling_flags(const ProfilingFlags& f) {
  if (!f.db.empty()) check_output("--db", f.db, OutputKind::kStore);
}

/// The backend and (optional) store the flags ask for.
struct ProfilingSession {
  std::unique_ptr<Profiler> backend;
  std::unique_ptr<ProfileStore> store;
  std::unique_ptr<CachedProfiler> cached;
  std::unique_ptr<Profiler> exact;     ///< the noise-free emulator of --prior emulator
  std::shared_ptr<SearchPrior> prior;  ///< the search's prior (null: cold starts)
};

/// The backend options the flags ask for.
inline ProfilerOptions profiler_options(const ProfilingFlags& f, const Workload& w) {
  ProfilerOptions o;
  o.gpu = w.gpu_name;
  o.noise = f.noise;
  o.time_noise = f.time_noise;
  o.seed = f.seed;
  o.delay_ms = f.delay_ms;
  o.trace_path = f.trace;
  o.allow_clock_control = f.allow_clock_control;
  o.devices = f.devices;
  o.window_s = f.window_s;
  o.cooldown_s = f.cooldown_s;
  return o;
}

inline ProfilingSession open_profiling(const ProfilingFlags& f, const Workload& w) {
  ProfilingSession s;
  const ProfilerOptions o = profiler_options(f, w);
  distributed::RemoteProfiler* remote = nullptr;
  if (f.mpi && mpi_coordinator) {
    if (f.backend == "trace") {
      throw InvalidInput(
          "--mpi with --backend trace: a trace is replayed from a file, there is nothing to "
          "distribute; drop --mpi");
    }
    // Each measuring rank owns one partition group: the GPUs of one TP x CP group.
    auto r = mpi_coordinator->open_backend(f.backend, o, w.parallel.tp * w.parallel.cp);
    remote = r.get();
    s.backend = std::move(r);
  } else {
    s.backend = create_profiler(f.backend, o);
  }
  if (!f.db.empty()) {
    create_parent_folders("--db", f.db);  // like optimize --out
    try {
      s.store = std::make_unique<ProfileStore>(f.db);
    } catch (const InvalidInput& e) {
      // The store's messages start with the path; name the flag too.
      const std::string msg = e.what();
      throw InvalidInput(msg.rfind(f.db + ":", 0) == 0 ? "--db " + msg
                                                       : fmt::format("--db {}: {}", f.db, msg));
    }
    note_profile_store(f.db, s.store->count_all());
  }
  // From here on a SIGINT/SIGTERM stops the run between two measurements (interrupt.h).
  install_interrupt_handlers();
  s.cached = std::make_unique<CachedProfiler>(*s.backend, s.store.get());
  if (remote) s.cached->set_parallel(remote);
  // The prior: the emulator's prediction where asked (or, by default, where the measurements
  // are real), else the store's related partitions where there is a store.
  const bool emulator_prior =
      f.prior == "emulator" || (f.prior == "auto" && (f.backend == "cuda" || f.backend == "trace"));
  if (emulator_prior) {
    ProfilerOptions eo = o;
    eo.noise = 0;
    eo.time_noise = 0;
    eo.delay_ms = 0;
    s.exact = create_profiler("emulator", eo);
    s.prior = create_search_prior("emulator", {nullptr, w.gpu_name, s.exact.get()});
  } else if (f.warm_start == "store" && s.store) {
    s.prior =
        create_search_prior("store", {s.store.get(), s.backend->gpu().name, nullptr, kRunStartS});
  }
  if (const auto fixed = s.backend->fixed_freq_mhz()) {
    std::cerr << "kareus: clock control is off: backend '" << s.backend->name()
              << "' measures at the card's current SM clock, " << *fixed
              << " MHz, so the search sees only that clock (--allow-clock-control locks clocks; "
                 "it needs root)\n";
  }
  return s;
}

/// Multi-fidelity search (kareus/screening.h): screen with short windows, confirm near the
/// front with --window-s ones.
struct ScreeningFlags {
  double window_s = 0;     ///< 0: no screening
  double cooldown_s = -1;  ///< -1: the screening window (the full window's 1:1 duty cycle)
  ScreeningOptions options;
  bool on() const { return window_s > 0; }
};

inline void add_screening_flags(CLI::App* cmd, ScreeningFlags& f) {
  cmd->add_option("--screen-window-s", f.window_s,
                  "multi-fidelity: measure the search's points with this shorter window first "
                  "and re-measure only those near the front with --window-s (0: off; an H200 "
                  "repeats energy to 1.6% at 2 s, 1.06% at 5 s)")
      ->capture_default_str()
      ->check(finite_in(0, false, 3600, "seconds"));
  cmd->add_option("--screen-cooldown-s", f.cooldown_s,
                  "multi-fidelity: cool-down after a screening point (-1: the screening window)")
      ->capture_default_str();
  cmd->add_option("--confirm-band", f.options.band,
                  "multi-fidelity: re-measure points within this many screening s.d. of the "
                  "estimated front")
      ->capture_default_str()
      ->check(finite_in(0, false, 100, "standard deviations"));
  cmd->add_option("--confirm-share", f.options.max_confirm_share,
                  "multi-fidelity: re-measure at most this share of the screened points")
      ->capture_default_str()
      ->check(finite_in(0, true, 1, "share"));
}

/// The screening options the flags ask for, with the full window of `profiling`. Throws
/// InvalidInput when screening is combined with what it does not support or the windows are
/// inconsistent.
inline ScreeningOptions screening_options(const ScreeningFlags& f, const ProfilingFlags& profiling,
                                          bool ask_mode) {
  if (!(f.cooldown_s >= 0 || f.cooldown_s == -1)) {
    throw InvalidInput(fmt::format("--screen-cooldown-s must be >= 0 or -1, got {}", f.cooldown_s));
  }
  ScreeningOptions o = f.options;
  o.window_s = f.window_s;
  o.cooldown_s = f.cooldown_s < 0 ? f.window_s : f.cooldown_s;
  o.full_window_s = profiling.window_s;
  if (f.window_s >= profiling.window_s) {
    throw InvalidInput(fmt::format(
        "--screen-window-s {} must be shorter than --window-s {}: screening is the cheap pass",
        f.window_s, profiling.window_s));
  }
  if (profiling.mpi || ask_mode || profiling.backend == "trace") {
    throw InvalidInput(
        "--screen-window-s works with --backend emulator or cuda on one process; drop it with "
        "--mpi, --ask or --backend trace (a trace has one measurement per point)");
  }
  return o;
}

/// The screening profiler next to `full`: the same backend and store, the screening window.
struct ScreeningSession {
  std::unique_ptr<Profiler> backend;
  std::unique_ptr<CachedProfiler> cached;
};

inline ScreeningSession open_screening(const ProfilingFlags& f, const Workload& w,
                                       const ProfilingSession& full, const ScreeningOptions& so) {
  ProfilerOptions o = profiler_options(f, w);
  o.window_s = so.window_s;
  o.cooldown_s = so.cooldown_s;
  ScreeningSession s;
  s.backend = create_profiler(f.backend, o);
  s.cached = std::make_unique<CachedProfiler>(*s.backend, full.store.get());
  return s;
}

/// The search space a partition has under this backend: only the observed clock when the
/// backend cannot set clocks.
inline SpaceOptions space_options(const Profiler& backend) {
  SpaceOptions o;
  if (const auto fixed = backend.fixed_freq_mhz()) o.freqs_mhz = {*fixed};
  return o;
}

}  // namespace kareus::cli
