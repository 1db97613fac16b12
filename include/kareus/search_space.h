// The configuration space of a partition: SM clocks x SMs of the collective x launch slots.
// Defaults follow the Kareus artifact on A100 (github.com/ml-energy/kareus): clocks from the GPU's
// search range (1410..900 MHz in 30 MHz steps), AllReduce SMs 3, 6, ..., 30,
// AllGather/ReduceScatter SMs 1..20, every launch slot of the partition; NCCL's default CTA
// count (GpuSpec::nccl_default_channels, the Nanobatching baseline's setting) joins the SM grid
// where it is missing, so that the space contains the baseline. Every list can be overridden.
#pragma once

#include <string>
#include <vector>

#include "kareus/hw.h"
#include "kareus/partition.h"
#include "kareus/profiler.h"

namespace kareus {

struct SpaceOptions {
  std::vector<int> freqs_mhz;  ///< empty: the GPU's default search range
  std::vector<int> sms;        ///< empty: by collective kind (see above)
};

/// Largest SM count a collective may be given (NCCL's channel limit).
constexpr int kMaxCollectiveSms = 32;

struct SearchSpace {
  std::vector<int> freqs_mhz;
  std::vector<int> sms;
  std::vector<std::string> slots;
  std::size_t size() const { return freqs_mhz.size() * sms.size() * slots.size(); }
  /// Every configuration, frequency-major (then SMs, then slot).
  std::vector<PartitionConfig> configs() const;
  PartitionConfig at(std::size_t index) const;
};

SearchSpace make_search_space(const Partition& p, const GpuSpec& gpu, const SpaceOptions& o = {});

/// Default SM counts for a collective kind.
std::vector<int> default_collective_sms(CollectiveKind kind);

/// Throws InvalidInput naming the allowed values when a configuration is not valid for the
/// partition on this GPU (clock not supported, SMs outside 1..32, unknown slot).
void validate_config(const Partition& p, const GpuSpec& gpu, const PartitionConfig& c);

}  // namespace kareus
