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
  return static_cast<double>(points) * (window_s + cooldown_s) +
         static_cast<double>(screen_points) * (screen_window_s + screen_cooldown_s);
}

double ProfilingCostEstimate::gpu_s() const { return wall_s() * gpus_per_measurement; }

double ProfilingCostEstimate::gpu_hours() const { return gpu_s() / 3600.0; }

std::string ProfilingCostEstimate::describe() const {
  const std::string screened =
      screen_points == 0 ? std::string()
                         : fmt::format("{} screened x ({:g} s window + {:g} s cool-down) + ",
                                       screen_points, screen_window_s, screen_cooldown_s);
  return fmt::format(
      "{:.1f} GPU-hours, {} on one {}-GPU node (estimate: {}{} configurations x ({:g} s window "
      "+ {:g} s cool-down), one node per measurement)",
      gpu_hours(), format_duration(wall_s()), gpus_per_measurement, screened, points, window_s,
      cooldown_s);
}

nlohmann::json ProfilingCostEstimate::to_json() const {
  return {{"estimate", true},
          {"points", points},
          {"window_s", window_s},
          {"cooldown_s", cooldown_s},
          {"gpus_per_measurement", gpus_per_measurement},
          {"screen_points", screen_points},
          {"screen_window_s", screen_window_s},
          {"screen_cooldown_s", screen_cooldown_s},
          {"wall_s", wall_s()},
          {"gpu_s", gpu_s()},
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

ProfilingCostEstimate estimate_profiling_cost(std::size_t points, int gpus_per_node,
                                              std::size_t screen_points, double screen_window_s,
                                              double screen_cooldown_s) {
  ProfilingCostEstimate e = estimate_profiling_cost(points, gpus_per_node);
  if (screen_points > 0 && (!(screen_window_s > 0) || !(screen_cooldown_s >= 0))) {
    throw InvalidInput(fmt::format(
        "profiling cost: screening needs a window > 0 s and a cool-down >= 0 s, got {} s and {} s",
        screen_window_s, screen_cooldown_s));
  }
  e.screen_points = screen_points;
  e.screen_window_s = screen_window_s;
  e.screen_cooldown_s = screen_cooldown_s;
  return e;
}

}  // namespace kareus
