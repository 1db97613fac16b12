// Picking a frontier point for a goal (include/kareus/planner.h): deadline, energy budget,
// max throughput, min energy, power cap per GPU or for the whole job.
#include <fmt/format.h>

#include <algorithm>

#include "kareus/error.h"
#include "kareus/frontier.h"
#include "kareus/planner.h"

namespace kareus {

std::string Goal::describe() const {
  switch (kind) {
    case GoalKind::kDeadline:
      return fmt::format("deadline {:.4f} s", value);
    case GoalKind::kEnergyBudget:
      return fmt::format("energy budget {:.1f} J", value);
    case GoalKind::kMaxThroughput:
      return "max-throughput";
    case GoalKind::kMinEnergy:
      return "min-energy";
    case GoalKind::kPowerCap:
      return fmt::format("power cap {:.1f} W/GPU", value);
    case GoalKind::kJobPowerCap:
      return fmt::format("job power cap {:.6g} kW", value);
  }
  return "?";
}

double Goal::power_limit_per_gpu_w() const {
  if (!power_cap() || gpus <= 0) {
    throw InternalError("Goal::power_limit_per_gpu_w: not a power cap with the job's GPUs");
  }
  return kind == GoalKind::kPowerCap ? value : value * 1e3 / gpus;
}

double average_power_per_gpu_w(double energy_j, double iteration_time_s, int gpus) {
  return energy_j / (iteration_time_s * gpus);
}

std::vector<std::size_t> ranked_points(const std::vector<FrontierPoint>& f, const Goal& g) {
  if (g.kind == GoalKind::kMaxThroughput) {
    if (f.empty()) return {};
    return {max_throughput_index(
        f, [](const FrontierPoint& p) { return p.time_s; },
        [](const FrontierPoint& p) { return p.energy_j; })};
  }
  const double limit_w = g.power_cap() ? g.power_limit_per_gpu_w() : 0;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const auto& p = f[i];
    bool meets = true;
    switch (g.kind) {
      case GoalKind::kDeadline:
        meets = p.time_s <= g.value;
        break;
      case GoalKind::kEnergyBudget:
        meets = p.energy_j <= g.value;
        break;
      case GoalKind::kPowerCap:
      case GoalKind::kJobPowerCap:
        meets = average_power_per_gpu_w(p.energy_j, p.time_s, g.gpus) <= limit_w;
        break;
      case GoalKind::kMaxThroughput:  // handled above
      case GoalKind::kMinEnergy:
        break;
    }
    if (meets) order.push_back(i);
  }
  const bool by_energy = g.kind == GoalKind::kDeadline || g.kind == GoalKind::kMinEnergy;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const FrontierPoint &x = f[a], &y = f[b];
    if (by_energy) return x.energy_j < y.energy_j;
    return x.time_s < y.time_s || (x.time_s == y.time_s && x.energy_j < y.energy_j);
  });
  return order;
}

std::optional<std::size_t> select_point(const std::vector<FrontierPoint>& f, const Goal& g) {
  const std::vector<std::size_t> order = ranked_points(f, g);
  if (order.empty()) return std::nullopt;
  return order.front();
}

}  // namespace kareus
