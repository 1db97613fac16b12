// The thermally stable measurement protocol (include/kareus/protocol.h), after the Kareus
// artifact's profiler (Wu, Chung, Chowdhury, OSDI '26): every attempt warms the
// device up, sizes the window from a calibration run, measures one window (time from the device,
// energy as the counter's difference, temperature, clock and throttle reasons around it) and
// cools down. A window whose clock left the expected clock by more than the allowed drift, or
// during which a transient throttle reason (thermal, hardware slowdown, power brake; not the
// steady software power cap) was raised, is measured again after the cool-down. Clocks and
// reasons come from samples taken during the window where the target provides them. Every
// attempt recalibrates, since a throttled calibration would size the next window wrongly.
#include "kareus/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kareus/error.h"

namespace kareus {
namespace {

void validate(const ProtocolOptions& o, int expected_clock_mhz) {
  auto bad = [](const char* option, const char* allowed, double v) {
    throw InvalidInput(
        fmt::format("measurement protocol: {} must be {}, got {}", option, allowed, v));
  };
  if (o.warmup_iterations < 0) bad("warmup_iterations", ">= 0", o.warmup_iterations);
  if (o.calibration_iterations < 1) bad("calibration_iterations", ">= 1", o.calibration_iterations);
  if (!(o.window_s > 0) || !std::isfinite(o.window_s)) bad("window_s", "> 0", o.window_s);
  if (!(o.cooldown_s >= 0) || !std::isfinite(o.cooldown_s)) bad("cooldown_s", ">= 0", o.cooldown_s);
  if (o.max_attempts < 1) bad("max_attempts", ">= 1", o.max_attempts);
  if (o.max_clock_drift_mhz < 0) bad("max_clock_drift_mhz", ">= 0", o.max_clock_drift_mhz);
  if (expected_clock_mhz < 0) bad("expected_clock_mhz", ">= 0", expected_clock_mhz);
}

// Smallest iteration count whose predicted length reaches the window.
int window_iterations(double window_s, double per_iteration_s) {
  const double n = std::ceil(window_s / per_iteration_s);
  if (!(n < 1e9)) {
    throw InternalError(fmt::format(
        "measurement protocol: one iteration takes {} s, a {} s window would need {} iterations",
        per_iteration_s, window_s, n));
  }
  int k = std::max(1, static_cast<int>(n));
  while (static_cast<double>(k) * per_iteration_s < window_s) ++k;  // rounding of the division
  return k;
}

}  // namespace

ProtocolResult run_protocol(MeasurementTarget& target, const ProtocolOptions& o,
                            int expected_clock_mhz) {
  validate(o, expected_clock_mhz);
  const int gpus = target.gpus();
  if (gpus < 1) throw InternalError(fmt::format("measurement target reports {} GPUs", gpus));
  ProtocolResult r;
  for (int attempt = 1; attempt <= o.max_attempts; ++attempt) {
    if (o.warmup_iterations > 0) target.run(o.warmup_iterations);
    const double calibration_s = target.run(o.calibration_iterations);
    if (!(calibration_s > 0)) {
      throw InternalError(
          fmt::format("measurement protocol: {} calibration iterations took {} s (must be > 0)",
                      o.calibration_iterations, calibration_s));
    }
    const int n = window_iterations(o.window_s, calibration_s / o.calibration_iterations);

    // A target that latches throttle reasons reports only the window's after this read.
    target.throttle_mask();
    const double temp_before = target.temperature_c();
    const int clock_before = target.sm_clock_mhz();
    const double e0 = target.energy_j();
    const WindowObservation w = target.run_window(n);
    const double elapsed_s = w.elapsed_s;
    const double e1 = target.energy_j();
    const int clock_after = target.sm_clock_mhz();
    const double temp_after = target.temperature_c();
    const std::uint64_t mask = target.throttle_mask() | w.throttle_mask;

    // In-window samples describe the window; reads around it are only a fallback, since on a
    // GPU they see the idle device before the window is queued and after it has synchronised.
    const bool sampled = w.samples > 0;
    const int clock_lo = sampled ? w.min_clock_mhz : std::min(clock_before, clock_after);
    const int clock_hi = sampled ? w.max_clock_mhz : std::max(clock_before, clock_after);
    const int clock_start = sampled ? w.first_clock_mhz : clock_before;

    r.attempts = attempt;
    r.iterations = n;
    r.window_s = elapsed_s;
    r.time_s = elapsed_s / n;
    r.energy_j = (e1 - e0) / n / gpus;
    r.temperature_before_c = temp_before;
    r.temperature_after_c = temp_after;
    r.clock_mhz = clock_lo;
    r.clock_max_mhz = clock_hi;
    r.throttle_mask = mask;

    // With no expected clock the window must at least keep the clock it started with.
    const int reference = expected_clock_mhz > 0 ? expected_clock_mhz : clock_start;
    const int drift = std::max(std::abs(clock_lo - reference), std::abs(clock_hi - reference));
    // A fall below the reference under the power cap alone is the setting's steady state.
    r.power_capped = drift > o.max_clock_drift_mhz && (mask & nvml::kReasonSwPowerCap) != 0 &&
                     (mask & kRepeatThrottleMask) == 0 &&
                     clock_hi <= reference + o.max_clock_drift_mhz;
    std::string why;
    if (drift > o.max_clock_drift_mhz && !r.power_capped) {
      why = fmt::format("clock {}..{} MHz drifted {} MHz from {} MHz (allowed {})", clock_lo,
                        clock_hi, drift, reference, o.max_clock_drift_mhz);
    }
    // sw_power_cap is recorded in the mask but is no transient: it does not repeat a window.
    if ((mask & kRepeatThrottleMask) != 0) {
      why += fmt::format("{}throttled ({})", why.empty() ? "" : ", ",
                         target.describe_throttle(mask & kRepeatThrottleMask));
    }
    if (!(e1 >= e0)) {
      why += fmt::format("{}energy counter went backwards ({} -> {} J)", why.empty() ? "" : ", ",
                         e0, e1);
    }
    if (o.cooldown_s > 0) target.idle(o.cooldown_s);
    if (why.empty()) {
      r.stable = true;
      return r;
    }
    r.note += fmt::format("{}attempt {}: {} (T {:.1f} -> {:.1f} C)", r.note.empty() ? "" : "; ",
                          attempt, why, temp_before, temp_after);
  }
  r.stable = false;
  return r;
}

}  // namespace kareus
