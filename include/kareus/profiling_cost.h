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
  std::size_t points = 0;        ///< configurations measured (or to measure)
  double window_s = 5.0;         ///< measurement window per configuration
  double cooldown_s = 5.0;       ///< idle cool-down after each measurement
  int gpus_per_measurement = 8;  ///< GPUs busy during one measurement (one node)

  double wall_s() const;     ///< points x (window + cool-down), measured one after another
  double gpu_hours() const;  ///< wall_s x gpus_per_measurement / 3600
  /// "5.5 GPU-hours, 41m20s on one 8-GPU node (estimate: 248 configurations x (5 s window +
  /// 5 s cool-down), one node per measurement)".
  std::string describe() const;
  /// {"points", "window_s", "cooldown_s", "gpus_per_measurement", "wall_s", "gpu_hours",
  ///  "estimate": true}.
  nlohmann::json to_json() const;
};

/// The estimate for `points` configurations measured on nodes of `gpus_per_node` GPUs, with
/// the default window and cool-down. Throws InvalidInput when gpus_per_node < 1.
ProfilingCostEstimate estimate_profiling_cost(std::size_t points, int gpus_per_node);

}  // namespace kareus
