// The real-hardware profiling-cost estimate (include/kareus/profiling_cost.h): configurations
// times (measurement window + cool-down) on one node, as the Kareus artifact measures.
#include "kareus/profiling_cost.h"

#include <fmt/format.h>

#include "kareus/error.h"
#include "kareus/profiler.h"
#include "kareus/progress.h"

namespace kareus {

// The profiler's own figure for one real measurement must be the same window and cool-down.
static_assert(ProfilingCostEstimate{}.window_s + ProfilingCostEstimate{}.cooldown_s ==
              kRealSecondsPerPoint);

double ProfilingCostEstimate::wall_s() const {
  return static_cast<double>(points) * (window_s + cooldown_s);
}

double ProfilingCostEstimate::gpu_hours() const { return wall_s() * gpus_per_measurement / 3600.0; }

std::string ProfilingCostEstimate::describe() const {
  return fmt::format(
      "{:.1f} GPU-hours, {} on one {}-GPU node (estimate: {} configurations x ({:g} s window + "
      "{:g} s cool-down), one node per measurement)",
      gpu_hours(), format_duration(wall_s()), gpus_per_measurement, points, window_s, cooldown_s);
}

nlohmann::json ProfilingCostEstimate::to_json() const {
  return {{"estimate", true},
          {"points", points},
          {"window_s", window_s},
          {"cooldown_s", cooldown_s},
          {"gpus_per_measurement", gpus_per_measurement},
          {"wall_s", wall_s()},
          {"gpu_hours", gpu_hours()}};
}

ProfilingCostEstimate estimate_profiling_cost(std::size_t points, int gpus_per_node) {
  if (gpus_per_node < 1) {
    throw InvalidInput(
        fmt::format("profiling cost: gpus per node must be >= 1, got {}", gpus_per_node));
  }
  ProfilingCostEstimate e;
  e.points = points;
  e.gpus_per_measurement = gpus_per_node;
  return e;
}

}  // namespace kareus
