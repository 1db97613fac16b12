// The thermally stable measurement protocol, shared by every backend that measures something
// real (brief: Kareus artifact's profiler). One point is measured as: warm-up iterations; a
// calibration run that sizes the iteration count to fill a window of `window_s`; the window,
// timed by the device (CUDA events on GPUs) with energy taken as the difference of the energy
// counter across the window; a cool-down of `cooldown_s`. Temperature is read before and after.
// A window whose clock drifted from the expected clock, or during which a throttle reason was
// raised, is repeated (up to `max_attempts`); the result says whether it ended stable.
//
// NVML's energy counter updates about every 100 ms, so windows under about 2 s are noisy; the
// default 5 s window and 5 s cool-down are the artifact's.
#pragma once

#include <cstdint>
#include <string>

namespace kareus {

struct ProtocolOptions {
  int warmup_iterations = 10;
  int calibration_iterations = 100;  ///< iterations timed to size the window (at least 1)
  double window_s = 5.0;
  double cooldown_s = 5.0;
  int max_attempts = 3;
  int max_clock_drift_mhz = 30;  ///< allowed |observed - expected| SM clock during the window
};

/// What the protocol drives: a repeatable unit of work on a group of GPUs with sensors.
/// The emulator's thermal model implements it in simulated time, the cuda backend on real GPUs.
class MeasurementTarget {
 public:
  virtual ~MeasurementTarget() = default;
  /// Runs `iterations` back to back and returns their elapsed device time in seconds.
  virtual double run(int iterations) = 0;
  /// Cumulative energy counter, summed over the group's GPUs (J).
  virtual double energy_j() = 0;
  /// Hottest GPU of the group (deg C).
  virtual double temperature_c() = 0;
  /// Lowest SM clock of the group right now (MHz).
  virtual int sm_clock_mhz() = 0;
  /// OR of the throttle reasons that bias a measurement, over the group (0: none).
  virtual std::uint64_t throttle_mask() = 0;
  virtual std::string describe_throttle(std::uint64_t mask) const = 0;
  /// Lets the GPUs idle for `seconds` (real sleep on GPUs, simulated time in the emulator).
  virtual void idle(double seconds) = 0;
  /// GPUs in the group; energy_j() / gpus() is the per-GPU figure.
  virtual int gpus() const = 0;
};

struct ProtocolResult {
  double time_s = 0;    ///< one iteration
  double energy_j = 0;  ///< one iteration, per GPU (mean over the group)
  int iterations = 0;   ///< in the accepted window
  double window_s = 0;  ///< measured length of the accepted window
  double temperature_before_c = 0;
  double temperature_after_c = 0;
  int clock_mhz = 0;                ///< observed SM clock (lowest of start and end of the window)
  int attempts = 0;                 ///< windows measured (1 when the first was stable)
  std::uint64_t throttle_mask = 0;  ///< of the accepted window
  bool stable = false;  ///< false: every attempt drifted or throttled; the last one is returned
  std::string note;     ///< why windows were repeated, for logs
};

/// Measures one point. `expected_clock_mhz` 0 accepts whatever clock the device runs (the window
/// must then keep the clock it started with, within max_clock_drift_mhz).
/// Every attempt runs: warm-up; calibration (window iterations = the fewest whose calibrated
/// length reaches window_s); throttle_mask() read and discarded (a target that latches reasons
/// then reports only the window's); temperature, clock and energy read; the window; energy, clock,
/// temperature and throttle_mask() read; idle(cooldown_s). The window is accepted when both clock
/// reads are within max_clock_drift_mhz of the expected clock and the mask is 0.
/// Throws InvalidInput naming the option when one is out of range (window_s <= 0, cooldown_s < 0,
/// max_attempts < 1, warmup_iterations < 0, calibration_iterations < 1, max_clock_drift_mhz < 0,
/// expected_clock_mhz < 0), before touching the target; InternalError when the target reports a
/// non-positive calibration time.
ProtocolResult run_protocol(MeasurementTarget& target, const ProtocolOptions& o,
                            int expected_clock_mhz);

}  // namespace kareus
