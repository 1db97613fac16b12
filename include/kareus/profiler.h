// Profiling interface: measure the time and energy of one partition under one configuration
// (SM clock, SMs of the collective, launch slot), of a segment at a clock, and the device's
// static power. Backends are chosen by name through a registry: `emulator` (the embedded
// model), `trace` (replays a CSV of measurements taken elsewhere). A `cuda` backend that
// profiles real partitions plugs in here later without changing callers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kareus/hw.h"
#include "kareus/instruction_settings.h"
#include "kareus/partition.h"

namespace kareus {

/// One measurement. Energies are per GPU; static_energy_j = static power x time_s exactly and
/// dynamic_energy_j = energy_j - static_energy_j.
struct Measurement {
  double time_s = 0;
  double energy_j = 0;
  double dynamic_energy_j = 0;
  double static_energy_j = 0;
};

/// Real profiling of one point: a 5 s measurement window plus a 5 s cool-down (the Kareus
/// artifact's profiler).
inline constexpr double kRealSecondsPerPoint = 10.0;

/// Repeatability of one measurement: the relative standard deviation of its time and of its
/// energy when the same point is measured again.
struct NoiseRel {
  double time = 0;
  double energy = 0;
  bool operator==(const NoiseRel&) const = default;
};

/// Measured on an H200 with the protocol's 5 s windows (docs/cuda.md, "Repeatability"): time
/// repeats to 0.10%, energy to 1.06% (RMS of the coefficients of variation of 12 points, 3-5
/// rounds each). Time is timed over hundreds of iterations with CUDA events; energy comes from
/// NVML's counter, which moves about every 100 ms while the power cap swings the clock.
inline constexpr double kTimeNoiseShare = 0.1;  ///< time noise / energy noise
inline constexpr NoiseRel kMeasuredNoiseRel{0.001, 0.01};

/// The window that kMeasuredNoiseRel and the emulator's --noise refer to: the protocol's
/// default (ProtocolOptions::window_s).
inline constexpr double kReferenceWindowS = 5.0;

/// Repeatability of a measurement taken with a `window_s` window, given the repeatability
/// `at_reference` of one taken with kReferenceWindowS. Energy: relative variance a + b /
/// window_s, both fitted to the H200's (docs/cuda.md, "Repeatability": 1.60% RMS at 2 s windows,
/// 1.06% at 5 s): b / window_s is what averages out in a longer window (NVML's counter steps
/// about every 100 ms, the power cap swings the clock within a window), a what does not (drift
/// between rounds). Time repeats to about 0.1% at either length and is kept. The result scales
/// `at_reference` by the ratio, so --noise 0 stays exact. Throws InvalidInput unless window_s is
/// finite and > 0.
NoiseRel noise_at_window(NoiseRel at_reference, double window_s);

/// Both objectives' noise from an energy noise and a time noise, where a negative time noise
/// (-1 by convention) means kTimeNoiseShare x the energy's (the measured ratio), so an exact
/// energy makes an exact time. Callers validate the values.
inline NoiseRel noise_with_time_share(double energy, double time = -1) {
  return {time < 0 ? kTimeNoiseShare * energy : time, energy};
}

struct ProfilerOptions {
  std::string gpu;  ///< catalogue name (from the workload)
  /// emulator: relative std. dev. of a measured energy (multiplicative, seeded)
  double noise = kMeasuredNoiseRel.energy;
  /// emulator: the same of a measured time; -1: kTimeNoiseShare x noise (so noise 0 is exact)
  double time_noise = -1;
  std::uint64_t seed = 1;  ///< emulator: noise seed
  int delay_ms = 0;        ///< emulator: wall time each measurement takes
  std::string trace_path;  ///< trace: CSV file
  // Real-GPU backends (cuda).
  bool allow_clock_control = false;  ///< lock SM clocks; without it measure at the current clock
  std::vector<int> devices = {};     ///< GPU indices of the partition's group; empty: 0..n-1
  /// Measurement window of the protocol; the emulator scales its noise to it
  /// (noise_at_window: --noise is the noise at kReferenceWindowS).
  double window_s = kReferenceWindowS;
  double cooldown_s = 5.0;  ///< cool-down after each point
};

class Profiler {
 public:
  virtual ~Profiler() = default;
  /// Registry name of the backend.
  virtual std::string name() const = 0;
  /// Everything that changes the backend's numbers (model parameters, noise, trace file
  /// contents): stored measurements are reused only under the same fingerprint.
  virtual std::string fingerprint() const = 0;
  virtual const GpuSpec& gpu() const = 0;
  virtual double static_power_w() const = 0;
  /// Measures static power (the group's GPUs blocked on a receive whose sender sleeps, as the
  /// Kareus artifact did); backends without a real device return static_power_w().
  virtual double measure_static_power_w() { return static_power_w(); }
  /// Set when the backend can only measure at one SM clock (a real GPU without clock control):
  /// callers restrict the search to this clock and say so.
  virtual std::optional<int> fixed_freq_mhz() const { return std::nullopt; }
  /// Repeatability of one measurement when the backend knows it (the emulator's --noise and
  /// --time-noise); real measurements leave it to the search's assumption
  /// (SearchOptions::noise_rel, kMeasuredNoiseRel by default).
  virtual std::optional<NoiseRel> noise_rel() const { return std::nullopt; }
  virtual Measurement measure(const Partition& p, const PartitionConfig& c) = 0;
  /// False when the backend has no way to produce this point (trace: not in the file), so
  /// that ask/tell profiling can ask for it instead of failing (CachedProfiler's ask mode).
  virtual bool can_measure(const Partition& /*p*/, const PartitionConfig& /*c*/) const {
    return true;
  }
  /// A segment runs alone; `instance` distinguishes segments with the same name.
  virtual Measurement measure_segment(const Segment& s, int freq_mhz) = 0;
};

using ProfilerFactory = std::function<std::unique_ptr<Profiler>(const ProfilerOptions&)>;

/// Registers a backend; returns true so it can initialise a static.
bool register_profiler(const std::string& name, ProfilerFactory factory);
/// Creates a backend by name; an unknown name throws InvalidInput listing the known names.
std::unique_ptr<Profiler> create_profiler(const std::string& name, const ProfilerOptions& o);
std::vector<std::string> profiler_names();

/// Splits total energy into static and dynamic parts.
Measurement make_measurement(double time_s, double energy_j, double static_power_w);

}  // namespace kareus
