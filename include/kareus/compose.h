// Hierarchical composition (Wu, Chung, Chowdhury, OSDI '26), instruction level: for each stage,
// instruction (forward, backward) and clock, combine the Pareto-optimal configurations of every
// partition in the instruction (one configuration per partition for all its instances, as in the
// paper), sum times and dynamic energies over the instances, add the segments, and keep the Pareto
// set on (time, dynamic energy). The sum of Pareto sets is computed incrementally (Minkowski sum
// with a Pareto filter after each partition), which is exact: every Pareto-optimal total is a sum
// of Pareto-optimal parts.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kareus/instruction_settings.h"
#include "kareus/partition.h"
#include "kareus/profiler.h"

namespace kareus {

/// One measured configuration of one partition (per instance, one GPU).
struct PartitionOption {
  PartitionConfig config;
  double time_s = 0;
  double dynamic_energy_j = 0;
};

/// For every clock, the Pareto-optimal (time, dynamic energy) configurations of one partition.
using PartitionFronts = std::map<int, std::vector<PartitionOption>>;

/// Cost of a segment at a clock (per instance, one GPU).
using SegmentCostFn = std::function<PartitionOption(const Segment&, int freq_mhz)>;

/// One way to run an instruction: its clock and every partition's configuration.
struct InstructionOption {
  int freq_mhz = 0;
  double time_s = 0;                                  ///< one micro-batch, one GPU
  double dynamic_energy_j = 0;                        ///< one micro-batch, one GPU
  std::map<std::string, PartitionConfig> partitions;  ///< by key (empty when sequential)
  /// With ComposeOptions::per_instance: partitions whose instances use several configurations.
  std::map<std::string, std::vector<ConfigShare>> mixes;
  /// The micro-batch runs whole, kernels in sequence (no nano-batches): Perseus's execution.
  bool sequential = false;
};

/// The power one GPU draws on average while it runs option `o` (W): its dynamic energy over its
/// time plus the static power per GPU (IterationDag::static_power_w, Profiler's static power),
/// since a card's draw, which a rack's breaker sees, includes both. An option that takes no
/// time draws the static power. The one definition behind every peak_instruction_power_w.
double instruction_power_w(const InstructionOption& o, double static_power_w);

struct ComposeOptions {
  std::vector<int> freqs_mhz;  ///< clocks to compose at (an instruction runs at one clock)
  /// Beyond the paper: let every instance (layer) of a partition pick its own configuration.
  /// The sum over n instances is then the Pareto set of all multisets of n options, which
  /// contains every uniform choice and the mixes between them.
  bool per_instance = false;
};

/// Pareto set of InstructionOptions of one instruction. `fronts` holds every partition of the
/// instruction (by key); a clock at which some partition has no option is skipped.
std::vector<InstructionOption> compose_instruction(
    const PartitionSet& ps, int stage, InstructionKind kind,
    const std::map<std::string, PartitionFronts>& fronts, const SegmentCostFn& segment_cost,
    const ComposeOptions& o);

/// Keeps the Pareto set on (time, dynamic energy), sorted by time ascending.
std::vector<InstructionOption> pareto_filter(std::vector<InstructionOption> options);

}  // namespace kareus
