#include "kareus/compose.h"

#include <fmt/format.h>

#include <algorithm>

#include "kareus/error.h"
#include "kareus/pareto.h"

namespace kareus {

double instruction_power_w(const InstructionOption& o, double static_power_w) {
  return o.time_s > 0 ? o.dynamic_energy_j / o.time_s + static_power_w : static_power_w;
}

std::vector<InstructionOption> pareto_filter(std::vector<InstructionOption> options) {
  return pareto_by_time_and_energy(std::move(options));
}

namespace {

// One way to run n instances: total time and energy, and how many instances use each option.
struct Multiset {
  double time_s = 0, energy_j = 0;
  std::vector<int> counts;
};

// Pareto set of the sums of n options drawn from `front` with repetition (one per instance),
// built one instance at a time with a Pareto filter after each step (exact, as above). States
// keep a parent link so that counts are rebuilt only for the final front.
std::vector<Multiset> multiset_front(const std::vector<PartitionOption>& front, int n) {
  struct State {
    double t, e;
    int parent, option;
  };
  std::vector<std::vector<State>> layers = {{{0, 0, -1, -1}}};
  std::vector<State> next;
  std::vector<Point2> pts;
  for (int k = 0; k < n; ++k) {
    next.clear();
    pts.clear();
    const auto& cur = layers.back();
    for (std::size_t c = 0; c < cur.size(); ++c) {
      for (std::size_t j = 0; j < front.size(); ++j) {
        next.push_back({cur[c].t + front[j].time_s, cur[c].e + front[j].dynamic_energy_j,
                        static_cast<int>(c), static_cast<int>(j)});
        pts.push_back({next.back().t, next.back().e});
      }
    }
    std::vector<State> kept;
    for (std::size_t i : pareto_front(pts)) kept.push_back(next[i]);
    layers.push_back(std::move(kept));
  }
  std::vector<Multiset> out;
  for (std::size_t i = 0; i < layers.back().size(); ++i) {
    Multiset m{layers.back()[i].t, layers.back()[i].e, std::vector<int>(front.size(), 0)};
    int idx = static_cast<int>(i);
    for (std::size_t l = layers.size() - 1; l > 0; --l) {
      const State& st = layers[l][static_cast<std::size_t>(idx)];
      ++m.counts[static_cast<std::size_t>(st.option)];
      idx = st.parent;
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

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
      const auto& front = fit->second;
      std::vector<InstructionOption> next;
      if (o.per_instance && front.size() > 1) {
        const auto sums = multiset_front(front, n);
        // Filter the (partial, multiset) pairs on their sums first and build options only for
        // the survivors: with deep stages and several options per clock the pairs run to tens
        // of millions, and an option carries maps (24 GB on Qwen3 1.7B TP8 per-layer, where the
        // survivors are a few thousand).
        std::vector<Point2> sum_pts;
        sum_pts.reserve(partial.size() * sums.size());
        for (const auto& p : partial) {
          for (const auto& m : sums) {
            sum_pts.push_back({p.time_s + m.time_s, p.dynamic_energy_j + m.energy_j});
          }
        }
        const std::vector<std::size_t> kept = pareto_front(sum_pts);
        next.reserve(kept.size());
        for (std::size_t pair : kept) {
          const InstructionOption& p = partial[pair / sums.size()];
          const Multiset& m = sums[pair % sums.size()];
          InstructionOption q = p;
          q.time_s += m.time_s;
          q.dynamic_energy_j += m.energy_j;
          std::vector<ConfigShare> shares;
          std::size_t most = 0;
          for (std::size_t j = 0; j < front.size(); ++j) {
            if (m.counts[j] == 0) continue;
            PartitionConfig c = front[j].config;
            c.freq_mhz = f;
            shares.push_back({c, m.counts[j]});
            if (m.counts[j] > m.counts[most]) most = j;
          }
          PartitionConfig main = front[most].config;
          main.freq_mhz = f;
          q.partitions[key] = main;
          if (shares.size() > 1) q.mixes[key] = std::move(shares);
          next.push_back(std::move(q));
        }
      } else {
        next.reserve(partial.size() * front.size());
        for (const auto& p : partial) {
          for (const auto& opt : front) {
            InstructionOption q = p;
            q.time_s += n * opt.time_s;
            q.dynamic_energy_j += n * opt.dynamic_energy_j;
            PartitionConfig c = opt.config;
            c.freq_mhz = f;
            q.partitions[key] = c;
            next.push_back(std::move(q));
          }
        }
      }
      partial = pareto_filter(std::move(next));
    }
    if (complete) all.insert(all.end(), partial.begin(), partial.end());
  }
  return pareto_filter(std::move(all));
}

}  // namespace kareus
