#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kareus/error.h"
#include "kareus/search_space.h"

namespace kareus {

std::vector<PartitionConfig> SearchSpace::configs() const {
  std::vector<PartitionConfig> out;
  out.reserve(size());
  for (std::size_t i = 0; i < size(); ++i) out.push_back(at(i));
  return out;
}

PartitionConfig SearchSpace::at(std::size_t index) const {
  const std::size_t ns = slots.size(), nm = sms.size();
  PartitionConfig c;
  c.slot = slots[index % ns];
  c.sms = sms[(index / ns) % nm];
  c.freq_mhz = freqs_mhz[index / (ns * nm)];
  return c;
}

SearchSpace make_search_space(const Partition& p, const GpuSpec& gpu, const SpaceOptions& o) {
  SearchSpace s;
  s.freqs_mhz = o.freqs_mhz.empty() ? gpu.candidate_freqs_mhz() : o.freqs_mhz;
  s.sms = o.sms.empty() ? default_collective_sms(p.collective.collective) : o.sms;
  // NCCL's default CTA count is the Nanobatching baseline's setting: the space must hold it so
  // that Kareus's options contain the baseline's (H100's 32 CTAs lie outside every grid).
  const int nccl_default = gpu.nccl_default_channels;
  if (o.sms.empty() && nccl_default >= 1 && nccl_default <= kMaxCollectiveSms &&
      std::find(s.sms.begin(), s.sms.end(), nccl_default) == s.sms.end()) {
    s.sms.insert(std::upper_bound(s.sms.begin(), s.sms.end(), nccl_default), nccl_default);
  }
  // The copy engines (0 SMs) lead the grid wherever the partition's chain can use them.
  if (o.sms.empty() && copy_engine_eligible(p)) s.sms.insert(s.sms.begin(), kCopyEngineSms);
  s.slots = p.slot_names();
  for (int f : s.freqs_mhz) {
    gpu.require_freq(f, fmt::format("frequency {} MHz", f));
  }
  for (int m : s.sms) {
    if (!sms_allowed(p, m)) {
      throw InvalidInput(
          fmt::format("SM count {} for partition {}: allowed {}", m, p.key, allowed_sms_text(p)));
    }
  }
  return s;
}

void validate_config(const Partition& p, const GpuSpec& gpu, const PartitionConfig& c) {
  gpu.require_freq(c.freq_mhz, fmt::format("--freq {}", c.freq_mhz));
  if (!sms_allowed(p, c.sms)) {
    throw InvalidInput(fmt::format(
        "--sms {}: partition {} allows {}; the search default for this collective is {}", c.sms,
        p.key, allowed_sms_text(p),
        fmt::join(default_collective_sms(p.collective.collective), ",")));
  }
  try {
    p.slot(c.slot);
  } catch (const InvalidInput&) {
    throw InvalidInput(fmt::format("--slot '{}': partition {} has launch slots {}", c.slot, p.key,
                                   fmt::join(p.slot_names(), ", ")));
  }
}

}  // namespace kareus
