// The thermally stable measurement protocol, shared by every backend that measures something
// real (the Kareus artifact's profiler, github ml-energy/kareus). One point is measured as: warm-up
// iterations; a calibration run that sizes the iteration count to fill a window of `window_s`; the
// window, timed by the device (CUDA events on GPUs) with energy taken as the difference of the
// energy counter across the window; a cool-down of `cooldown_s`. Temperature is read before and
// after. A window whose clock drifted from the expected clock, or during which a transient throttle
// reason was raised, is repeated (up to `max_attempts`); the result says whether it ended stable.
//
// Clocks and throttle reasons are observed DURING the window where the target can
// (MeasurementTarget::run_window): NVML reports the instantaneous state, and reads taken before
// the window is queued or after it has synchronised see an idle GPU.
//
// Which reasons repeat a window (kRepeatThrottleMask): thermal slowdowns (software and hardware),
// hardware slowdown and hardware power brake, which are transients a cool-down can clear.
// Software power capping (0x4, sw_power_cap) is recorded in ProtocolResult.throttle_mask but does
// not repeat a window: it is the normal steady state of GEMM-heavy work at top clock on A100/H100
// and no cool-down removes it. A window whose clock fell below the expected clock while the card
// reported sw_power_cap (and no transient reason) is accepted as power-capped: that is what the
// clock setting yields on this card, locked or not, and repeating it cannot change it (seen on an
// H200 at 1980 MHz: GEMM partitions at its 700 W limit ran at 1215-1770 MHz; docs/cuda.md). A
// clock above the expected one, or a fall without the cap, is still repeated by the drift check.
//
// NVML's energy counter updates about every 100 ms, so windows under about 2 s are noisy; the
// default 5 s window and 5 s cool-down are the artifact's.
#pragma once

#include <cstdint>
#include <string>

#include "kareus/nvml.h"

namespace kareus {

/// Throttle reasons that repeat a window (nvmlClocksEventReasons bits): hw_slowdown (0x8),
/// sw_thermal_slowdown (0x20), hw_thermal_slowdown (0x40), hw_power_brake (0x80). Not
/// sw_power_cap (0x4), see above.
inline constexpr std::uint64_t kRepeatThrottleMask =
    nvml::kBiasingReasons & ~nvml::kReasonSwPowerCap;

/// What a target saw during one window (MeasurementTarget::run_window).
struct WindowObservation {
  double elapsed_s = 0;             ///< device time of the window's iterations
  int samples = 0;                  ///< in-window clock samples; 0: none (the protocol falls back
                                    ///< to the reads before and after the window)
  int first_clock_mhz = 0;          ///< lowest SM clock of the group at the first sample
  int min_clock_mhz = 0;            ///< lowest SM clock of the group over the samples
  int max_clock_mhz = 0;            ///< highest of the per-sample group minima
  std::uint64_t throttle_mask = 0;  ///< OR of the reasons over the samples
};

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
  /// The measured window: runs `iterations` like run() and, where the target can, samples the
  /// SM clock and throttle reasons while they execute (the cuda target polls NVML about every
  /// 50 ms until the window's stop event completes). The default samples nothing (samples = 0),
  /// for targets whose reads before and after the window already describe it (the emulator's
  /// thermal model latches its reasons, scripted test targets).
  virtual WindowObservation run_window(int iterations) {
    WindowObservation w;
    w.elapsed_s = run(iterations);
    return w;
  }
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
  /// Lowest SM clock observed: over the in-window samples, or of the reads before and after the
  /// window when the target samples nothing.
  int clock_mhz = 0;
  int clock_max_mhz = 0;            ///< highest SM clock observed, same sources
  int attempts = 0;                 ///< windows measured (1 when the first was stable)
  std::uint64_t throttle_mask = 0;  ///< every reason of the accepted window, sw_power_cap included
  bool stable = false;  ///< false: every attempt drifted or throttled; the last one is returned
  /// The accepted window ran below the expected clock under the card's power cap (see above);
  /// clock_mhz..clock_max_mhz is the range it ran at.
  bool power_capped = false;
  std::string note;  ///< why windows were repeated, for logs
};

/// Measures one point. `expected_clock_mhz` 0 accepts whatever clock the device runs (the window
/// must then keep the clock it started with, within max_clock_drift_mhz).
/// Every attempt runs: warm-up; calibration (window iterations = the fewest whose calibrated
/// length reaches window_s); throttle_mask() read and discarded (a target that latches reasons
/// then reports only the window's); temperature, clock and energy read; the window (run_window);
/// energy, clock, temperature and throttle_mask() read; idle(cooldown_s). The window's clocks are
/// its in-window samples when there are any (the reference without an expected clock is then the
/// first sample), else the reads before and after it; its mask is the samples' OR the read after.
/// The window is accepted when every clock is within max_clock_drift_mhz of the expected clock
/// and the mask has no bit of kRepeatThrottleMask.
/// Throws InvalidInput naming the option when one is out of range (window_s <= 0, cooldown_s < 0,
/// max_attempts < 1, warmup_iterations < 0, calibration_iterations < 1, max_clock_drift_mhz < 0,
/// expected_clock_mhz < 0), before touching the target; InternalError when the target reports a
/// non-positive calibration time.
ProtocolResult run_protocol(MeasurementTarget& target, const ProtocolOptions& o,
                            int expected_clock_mhz);

}  // namespace kareus
