// How one pipeline instruction runs: its SM clock and, when its nano-batches overlap, each
// partition's configuration (SMs of the collective, launch slot), optionally per layer. The plan
// file carries these settings (include/kareus/plan.h), the emulator replays them
// (include/kareus/emulator.h) and the profilers measure one partition configuration
// (include/kareus/profiler.h). Owned by kareus_plan: plain value types, no dependencies.
//
// Thread-safety: plain value types; concurrent reads are safe.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kareus {

/// Largest SM count a collective may be given (NCCL's channel limit): the rule for SM counts
/// in the search space, `kareus profile` and every plan.
constexpr int kMaxCollectiveSms = 32;
/// The SM count that runs a collective on the copy engines instead (NCCL >= 2.28,
/// NCCL_CTA_POLICY_ZERO): allowed only where the partition's chain can (copy_engine_eligible in
/// include/kareus/partition.h).
constexpr int kCopyEngineSms = 0;

/// The knobs of one partition. `slot` names one of Partition::slots.
struct PartitionConfig {
  int freq_mhz = 0;
  int sms = 0;  ///< SMs (one CTA each) given to the collective; 0: the copy engines
  std::string slot;
  bool operator==(const PartitionConfig&) const = default;
};

enum class ExecutionMode { kSequential, kOverlapped };

/// How one instruction runs: its clock and, when overlapped, each partition's SMs and slot.
/// Instances of one partition that run with one configuration (a per-layer choice).
struct ConfigShare {
  PartitionConfig config;
  int instances = 0;
  bool operator==(const ConfigShare&) const = default;
};

struct InstructionSettings {
  int freq_mhz = 0;
  std::map<std::string, PartitionConfig> partitions;  ///< by partition key; freq ignored
  /// Optional per-instance choice that overrides `partitions` for its key: the first
  /// `instances` occurrences (in execution order) use the first share's configuration, the
  /// next ones the second share's, and so on.
  std::map<std::string, std::vector<ConfigShare>> mixes;
  /// Runs the micro-batch whole, kernels in sequence (no nano-batches, no partitions), inside
  /// an otherwise overlapped schedule: where overlap does not pay, Kareus plans an instruction
  /// the way Perseus would.
  bool sequential = false;
};

}  // namespace kareus
