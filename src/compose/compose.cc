#include "kareus/compose.h"

#include <fmt/format.h>

#include <algorithm>

#include "kareus/error.h"
#include "kareus/pareto.h"

namespace kareus {

std::vector<InstructionOption> pareto_filter(std::vector<InstructionOption> options) {
  std::vector<Point2> pts;
  for (const auto& o : options) pts.push_back({o.time_s, o.dynamic_energy_j});
  std::vector<InstructionOption> out;
  for (std::size_t i : pareto_front(pts)) out.push_back(std::move(options[i]));
  return out;
}

std::vector<InstructionOption> compose_instruction(
    const PartitionSet& ps, int stage, InstructionKind kind,
    const std::map<std::string, PartitionFronts>& fronts, const SegmentCostFn& segment_cost,
    const ComposeOptions& o) {
  const auto& steps = ps.instruction(stage, kind).steps;
  // Instances of each partition and the segments, from the instruction's steps.
  std::map<std::string, int> count;
  std::vector<const Segment*> segments;
  for (const auto& s : steps) {
    if (s.kind == Step::Kind::kPartition) {
      ++count[ps.partitions[static_cast<std::size_t>(s.index)].key];
    } else {
      segments.push_back(&ps.segments[static_cast<std::size_t>(s.index)]);
    }
  }
  std::vector<InstructionOption> all;
  for (int f : o.freqs_mhz) {
    InstructionOption base;
    base.freq_mhz = f;
    for (const Segment* seg : segments) {
      const PartitionOption c = segment_cost(*seg, f);
      base.time_s += c.time_s;
      base.dynamic_energy_j += c.dynamic_energy_j;
    }
    std::vector<InstructionOption> partial = {base};
    bool complete = true;
    for (const auto& [key, n] : count) {
      auto it = fronts.find(key);
      if (it == fronts.end()) {
        throw InternalError(fmt::format("no profile for partition {}", key));
      }
      auto fit = it->second.find(f);
      if (fit == it->second.end() || fit->second.empty()) {
        complete = false;
        break;
      }
      std::vector<InstructionOption> next;
      next.reserve(partial.size() * fit->second.size());
      for (const auto& p : partial) {
        for (const auto& opt : fit->second) {
          InstructionOption q = p;
          q.time_s += n * opt.time_s;
          q.dynamic_energy_j += n * opt.dynamic_energy_j;
          PartitionConfig c = opt.config;
          c.freq_mhz = f;
          q.partitions[key] = c;
          next.push_back(std::move(q));
        }
      }
      partial = pareto_filter(std::move(next));
    }
    if (complete) all.insert(all.end(), partial.begin(), partial.end());
  }
  return pareto_filter(std::move(all));
}

}  // namespace kareus
