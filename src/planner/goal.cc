// Picking a frontier point for a goal (include/kareus/planner.h): deadline, energy budget,
// max throughput, min energy.
#include <fmt/format.h>

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
  }
  return "?";
}

std::optional<std::size_t> select_point(const std::vector<FrontierPoint>& f, const Goal& g) {
  if (g.kind == GoalKind::kMaxThroughput) {
    if (f.empty()) return std::nullopt;
    return max_throughput_index(
        f, [](const FrontierPoint& p) { return p.time_s; },
        [](const FrontierPoint& p) { return p.energy_j; });
  }
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const auto& p = f[i];
    bool better = false;
    switch (g.kind) {
      case GoalKind::kDeadline:
        better = p.time_s <= g.value && (!best || p.energy_j < f[*best].energy_j);
        break;
      case GoalKind::kEnergyBudget:
        better = p.energy_j <= g.value && (!best || p.time_s < f[*best].time_s);
        break;
      case GoalKind::kMaxThroughput:  // handled above
        break;
      case GoalKind::kMinEnergy:
        better = !best || p.energy_j < f[*best].energy_j;
        break;
    }
    if (better) best = i;
  }
  return best;
}

}  // namespace kareus
