// The one estimate of what profiling would cost on real GPUs, used by every verb that prints
// one (kareus optimize, eval's reports, profile --sweep). The emulator answers in milliseconds;
// a real measurement of a configuration runs it for a measurement window and then lets the GPU
// cool down, on every GPU of the group the partition needs (Kareus artifact defaults,
// github.com/ml-energy/kareus: 5 s window, 5 s cool-down, a whole node because a partition's
// collective spans the tensor-parallel group, which is a node in every paper workload). It is an
// estimate, and every printed form says so with its assumptions.
//
// Thread-safety: plain value type and pure functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace kareus {

struct ProfilingCostEstimate {
  std::size_t points = 0;        ///< configurations measured (or to measure) with the full window
  double window_s = 5.0;         ///< measurement window per configuration
  double cooldown_s = 5.0;       ///< idle cool-down after each measurement
  int gpus_per_measurement = 8;  ///< GPUs busy during one measurement (one node)
  /// Screening (multi-fidelity search, kareus/screening.h): configurations measured first with
  /// a shorter window and cool-down; 0 when the search did not screen.
  std::size_t screen_points = 0;
  double screen_window_s = 0;
  double screen_cooldown_s = 0;

  /// Every measurement one after another: points x (window + cool-down) plus the same for the
  /// screening points.
  double wall_s() const;
  double gpu_s() const;      ///< wall_s x gpus_per_measurement
  double gpu_hours() const;  ///< gpu_s / 3600
  /// "5.5 GPU-hours, 41m20s on one 8-GPU node (estimate: 248 configurations x (5 s window +
  /// 5 s cool-down), one node per measurement)"; with screening the screening points come
  /// first: "(estimate: 56 screened x (2 s window + 2 s cool-down) + 14 configurations x ...)".
  std::string describe() const;
  /// {"points", "window_s", "cooldown_s", "gpus_per_measurement", "screen_points",
  ///  "screen_window_s", "screen_cooldown_s", "wall_s", "gpu_s", "gpu_hours", "estimate": true}.
  nlohmann::json to_json() const;
};

/// The estimate for `points` configurations measured on nodes of `gpus_per_node` GPUs, with
/// the default window and cool-down. Throws InvalidInput when gpus_per_node < 1.
ProfilingCostEstimate estimate_profiling_cost(std::size_t points, int gpus_per_node);

/// The same with `screen_points` configurations screened first with `screen_window_s` windows
/// and `screen_cooldown_s` cool-downs. Throws InvalidInput as above, and when screening points
/// are given with a window that is not > 0 or a negative cool-down.
ProfilingCostEstimate estimate_profiling_cost(std::size_t points, int gpus_per_node,
                                              std::size_t screen_points, double screen_window_s,
                                              double screen_cooldown_s);

}  // namespace kareus
