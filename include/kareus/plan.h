// Executable plans: what a training job needs to run one frontier point. A plan is versioned
// JSON: workload identity, goal, the predicted `iteration_time_s` and `energy_j` (whole job),
// and per stage the ordered instructions, each with its micro-batch, SM clock and, per
// partition, the collective's SM count and launch slot. The runtime (frequency controller and
// plan executor) and `kareus emulate --plan` read the same file.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kareus/emulator.h"
#include "kareus/frontier.h"

namespace kareus {

struct PlanInstruction {
  InstructionKind kind = InstructionKind::kForward;
  int microbatch = 0;
  int freq_mhz = 0;
  double time_s = 0;                                      ///< predicted, one GPU
  double dynamic_energy_j = 0;                            ///< predicted, one GPU
  std::map<std::string, PartitionConfig> partitions;      ///< by key; freq_mhz = the instruction's
  std::map<std::string, std::vector<ConfigShare>> mixes;  ///< per-layer choices, if any
};

struct PlanStage {
  int stage = 0;
  std::vector<PlanInstruction> instructions;  ///< in 1F1B execution order
};

struct Plan {
  static constexpr int kVersion = 1;
  std::string workload;         ///< workload name
  std::string workload_digest;  ///< partition signatures: a plan only runs on its workload
  std::string gpu;
  int gpus = 0;
  std::string method;  ///< kareus, perseus, nanobatch_perseus, ...
  ExecutionMode execution = ExecutionMode::kOverlapped;
  std::string goal;  ///< e.g. "deadline 5.0 s", "max-throughput"
  double iteration_time_s = 0;
  double energy_j = 0;  ///< whole job, one iteration
  double static_power_w = 0;
  std::vector<PlanStage> stages;

  nlohmann::json to_json() const;
  static Plan from_json(const nlohmann::json& j, const std::string& source);
  /// The instruction settings the emulator replays (throws InvalidInput if one is missing).
  InstructionSettings settings(int stage, InstructionKind kind, int microbatch) const;
};

/// Reads a plan file; a malformed or foreign file throws InvalidInput naming the file and field.
Plan load_plan(const std::string& path);
void save_plan(const Plan& p, const std::string& path);

/// A digest of a workload's partitions and shape, to tie plans to workloads.
std::string workload_digest(const Workload& w, const PartitionSet& ps);
/// The same, partitioning the workload first.
std::string workload_digest(const Workload& w);

enum class GoalKind { kDeadline, kEnergyBudget, kMaxThroughput, kMinEnergy };
struct Goal {
  GoalKind kind = GoalKind::kMaxThroughput;
  double value = 0;  ///< seconds (deadline) or joules (energy budget)
  std::string describe() const;
};

/// Index of the frontier point that meets the goal, or nullopt if none does.
std::optional<std::size_t> select_point(const std::vector<FrontierPoint>& frontier, const Goal& g);

}  // namespace kareus
