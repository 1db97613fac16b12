// The configuration space of a partition: SM clocks x SMs of the collective x launch slots.
// Defaults follow the Kareus artifact on A100 (github.com/ml-energy/kareus): clocks from the GPU's
// search range (1410..900 MHz in 30 MHz steps), AllReduce SMs 3, 6, ..., 30,
// AllGather/ReduceScatter SMs 1..20, AllToAll 2, 4, ..., 32 and 0 (the copy engines) where the
// partition's chain allows it (copy_engine_eligible), every launch slot of the partition; NCCL's
// default CTA count (GpuSpec::nccl_default_channels, the Nanobatching baseline's setting) joins the
// SM grid where it is missing, so that the space contains the baseline. Every list can be
// overridden.
#pragma once

#include <string>
#include <vector>

#include "kareus/hw.h"
#include "kareus/instruction_settings.h"
#include "kareus/partition.h"
#include "kareus/profiler.h"

namespace kareus {

struct SpaceOptions {
  std::vector<int> freqs_mhz;  ///< empty: the GPU's default search range
  std::vector<int> sms;        ///< empty: by collective kind (see above)
};

// kMaxCollectiveSms, the largest SM count a collective may be given: instruction_settings.h.

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

/// Default SM counts for a collective kind. Inline, so that plan validation can name them in
/// its messages without linking the search.
inline std::vector<int> default_collective_sms(CollectiveKind kind) {
  std::vector<int> out;
  if (kind == CollectiveKind::kAllReduce) {
    for (int s = 3; s <= 30; s += 3) out.push_back(s);
  } else if (kind == CollectiveKind::kAllToAll) {
    // Up to NCCL's channel limit: DeepSeek-V3 gives its all-to-all 20 of the H800's 132 SMs.
    for (int s = 2; s <= kMaxCollectiveSms; s += 2) out.push_back(s);
  } else {
    for (int s = 1; s <= 20; ++s) out.push_back(s);
  }
  return out;
}

/// Throws InvalidInput naming the allowed values when a configuration is not valid for the
/// partition on this GPU (clock not supported, SMs outside 1..32, unknown slot).
void validate_config(const Partition& p, const GpuSpec& gpu, const PartitionConfig& c);

}  // namespace kareus
