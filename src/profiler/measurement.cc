// Measurement helpers of the profiling interface (include/kareus/profiler.h).
#include "kareus/profiler.h"

namespace kareus {

Measurement make_measurement(double time_s, double energy_j, double static_power_w) {
  Measurement m;
  m.time_s = time_s;
  m.energy_j = energy_j;
  m.static_energy_j = static_power_w * time_s;
  m.dynamic_energy_j = energy_j - m.static_energy_j;
  return m;
}

}  // namespace kareus
