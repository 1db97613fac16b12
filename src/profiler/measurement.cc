// Measurement helpers of the profiling interface (include/kareus/profiler.h).
#include <fmt/format.h>

#include <cmath>

#include "kareus/error.h"
#include "kareus/profiler.h"

namespace kareus {
namespace {

// Relative energy variance of one measurement = kEnergyVarFloor + kEnergyVarPerS / window_s,
// through the two measured window lengths of docs/cuda.md ("Repeatability", one H200):
// 0.0160^2 at 2 s and 0.0106^2 at 5 s.
constexpr double kEnergyVarPerS = (0.0160 * 0.0160 - 0.0106 * 0.0106) / (1.0 / 2 - 1.0 / 5);
constexpr double kEnergyVarFloor = 0.0106 * 0.0106 - kEnergyVarPerS / 5;

}  // namespace

NoiseRel noise_at_window(NoiseRel at_reference, double window_s) {
  if (!(window_s > 0) || !std::isfinite(window_s)) {
    throw InvalidInput(fmt::format("measurement window must be > 0 s, got {}", window_s));
  }
  const double ratio = std::sqrt((kEnergyVarFloor + kEnergyVarPerS / window_s) /
                                 (kEnergyVarFloor + kEnergyVarPerS / kReferenceWindowS));
  return {at_reference.time, at_reference.energy * ratio};
}

Measurement make_measurement(double time_s, double energy_j, double static_power_w) {
  Measurement m;
  m.time_s = time_s;
  m.energy_j = energy_j;
  m.static_energy_j = static_power_w * time_s;
  m.dynamic_energy_j = energy_j - m.static_energy_j;
  return m;
}

}  // namespace kareus
