// Priors for warm starts (kareus/search_prior.h).
//
// `store`: transfer from related partitions. The partitions of one kind ("fwd_mlp") at other
// micro-batch sizes, sequence lengths, TP/CP degrees or models run the same chain of kernels at
// other sizes, so how the clock, the collective's SMs and its launch slot move time and energy
// is similar once the size is known (the premise of multi-task and transfer Bayesian
// optimization: Swersky, Snoek, Adams, NeurIPS 2013; Feurer, Letham, Bakshy, "Scalable
// meta-learning for Bayesian optimization", 2018, who also warm-start from models of related
// tasks). One gradient-boosted-tree model per objective (Chen & Guestrin, KDD '16) is trained
// on every related point with the size as features, its targets centred per source partition
// so it learns the shape of the response and the search's own points set the level. mbo
// decides how much to trust it (choose_prior_weight), so a store of unrelated partitions costs
// nothing but the refits. The prediction handed to mbo is the trees' additive part over
// (clock) + (SMs, slot) (docs/search.md, "Warm starts"): trained on the noisy points of a
// handful of other shapes, the trees' clock-by-choice interactions do not carry over, and mbo's
// additive residual model can correct a prior's main effects from the partition's own points
// but not its interactions, which then steer every batch.
//
// `emulator`: the emulator's noise-free prediction of the same configuration, for real GPUs
// and traces (the sim-to-real gap is in the level and in details the cross-validated weight
// can turn off).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "kareus/error.h"
#include "kareus/search_prior.h"
#include "kareus/surrogate.h"

namespace kareus {
namespace {

constexpr std::size_t kShapeFeatures = 8;

double log10_or_zero(double v) { return v > 0 ? std::log10(v) : 0.0; }

// One row of the store prior's features; false when the slot is not one of the shape's.
bool shape_row(const PartitionShape& s, const PartitionConfig& c, int max_freq_mhz, float* row) {
  const auto it = std::find(s.slots.begin(), s.slots.end(), c.slot);
  if (it == s.slots.end()) return false;
  const auto pos = static_cast<double>(it - s.slots.begin());
  row[0] = static_cast<float>(static_cast<double>(c.freq_mhz) / std::max(1, max_freq_mhz));
  row[1] = static_cast<float>(c.sms);
  row[2] = static_cast<float>(s.slots.size() > 1 ? pos / (s.slots.size() - 1) : 0.0);
  row[3] = static_cast<float>(log10_or_zero(s.compute_flops));
  row[4] = static_cast<float>(log10_or_zero(s.compute_bytes));
  row[5] = static_cast<float>(log10_or_zero(s.collective_bytes));
  row[6] = static_cast<float>(s.group_size);
  // Collective bytes per compute FLOP: how long the collective runs against the compute it
  // overlaps, which sets how many SMs it pays to give it. A tree splits one feature at a time,
  // so the ratio carries over between shapes where the two sizes apart do not.
  row[7] = static_cast<float>(s.collective_bytes > 0 && s.compute_flops > 0
                                  ? std::log10(s.collective_bytes / s.compute_flops)
                                  : 0.0);
  return true;
}

// The least-squares additive fit z(clock, choice) ~ c(clock) + h(choice) over the whole space, in
// place. The space is a full grid (every clock with every (SMs, slot) choice, each once,
// frequency-major), so the fit is the clock mean plus the choice mean less the grand mean.
void keep_additive_part(const SearchSpace& space, std::vector<double>& z) {
  const std::size_t choices = space.sms.size() * space.slots.size();
  if (z.empty() || choices == 0) return;
  std::vector<double> clock_sum(space.freqs_mhz.size()), choice_sum(choices);
  double grand = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    clock_sum[i / choices] += z[i];
    choice_sum[i % choices] += z[i];
    grand += z[i];
  }
  grand /= static_cast<double>(z.size());
  const auto n_clocks = static_cast<double>(space.freqs_mhz.size());
  for (std::size_t i = 0; i < z.size(); ++i) {
    z[i] = clock_sum[i / choices] / static_cast<double>(choices) +
           choice_sum[i % choices] / n_clocks - grand;
  }
}

double safe_log(double v) { return std::log(std::max(v, 1e-300)); }

class StorePrior : public SearchPrior {
 public:
  StorePrior(RelatedSource source, std::uint64_t seed) : source_(std::move(source)), seed_(seed) {}
  std::string name() const override { return "store"; }

  PriorPrediction predict(const Partition& p, const SearchSpace& space) override {
    const auto related = source_(p);
    Matrix x;
    x.cols = kShapeFeatures;
    std::vector<float> yt, ye, yd;
    std::vector<float> row(kShapeFeatures);
    for (const auto& rp : related) {
      int max_freq = 0;
      for (const auto& [c, m] : rp.points) max_freq = std::max(max_freq, c.freq_mhz);
      const std::size_t first = yt.size();
      double mt = 0, me = 0, md = 0;
      for (const auto& [c, m] : rp.points) {
        if (!(m.time_s > 0 && m.energy_j > 0 && m.dynamic_energy_j > 0)) continue;
        if (!shape_row(rp.shape, c, max_freq, row.data())) continue;
        x.data.insert(x.data.end(), row.begin(), row.end());
        ++x.rows;
        yt.push_back(static_cast<float>(safe_log(m.time_s)));
        ye.push_back(static_cast<float>(safe_log(m.energy_j)));
        yd.push_back(static_cast<float>(safe_log(m.dynamic_energy_j)));
        mt += yt.back();
        me += ye.back();
        md += yd.back();
      }
      const std::size_t n = yt.size() - first;
      if (n == 0) continue;
      for (std::size_t i = first; i < yt.size(); ++i) {
        yt[i] -= static_cast<float>(mt / n);
        ye[i] -= static_cast<float>(me / n);
        yd[i] -= static_cast<float>(md / n);
      }
    }
    // Fewer points than one small space says too little to be worth a model.
    constexpr std::size_t kMinRelatedPoints = 50;
    if (x.rows < kMinRelatedPoints) return {};
    const PartitionShape target = partition_shape(p);
    const int max_freq = space.freqs_mhz.empty()
                             ? 1
                             : *std::max_element(space.freqs_mhz.begin(), space.freqs_mhz.end());
    Matrix q;
    q.cols = kShapeFeatures;
    for (const auto& c : space.configs()) {
      std::fill(row.begin(), row.end(), 0.0f);
      if (!shape_row(target, c, max_freq, row.data())) {
        throw InternalError(
            fmt::format("partition {}: slot '{}' not among its slots", p.key, c.slot));
      }
      q.data.insert(q.data.end(), row.begin(), row.end());
      ++q.rows;
    }
    PriorPrediction out;
    auto fit = [&](const std::vector<float>& y, std::uint64_t k) {
      XgbParams xp;
      xp.max_depth = 6;
      xp.eta = 0.1;
      xp.rounds = 200;
      xp.subsample = 0.8;
      xp.colsample_bytree = 1.0;
      xp.seed = seed_ * 7 + k;
      XgbRegressor m(xp);
      m.fit(x, y);
      const auto pred = m.predict(q);
      return std::vector<double>(pred.begin(), pred.end());
    };
    out.log_time_s = fit(yt, 1);
    out.log_energy_j = fit(ye, 2);
    out.log_dynamic_energy_j = fit(yd, 3);
    keep_additive_part(space, out.log_time_s);
    keep_additive_part(space, out.log_energy_j);
    keep_additive_part(space, out.log_dynamic_energy_j);
    return out;
  }

 private:
  RelatedSource source_;
  std::uint64_t seed_;
};

class ProfilerPrior : public SearchPrior {
 public:
  explicit ProfilerPrior(Profiler& exact) : exact_(exact) {}
  std::string name() const override { return exact_.name(); }
  PriorPrediction predict(const Partition& p, const SearchSpace& space) override {
    PriorPrediction out;
    for (const auto& c : space.configs()) {
      const Measurement m = exact_.measure(p, c);
      out.log_time_s.push_back(safe_log(m.time_s));
      out.log_energy_j.push_back(safe_log(m.energy_j));
      out.log_dynamic_energy_j.push_back(safe_log(m.dynamic_energy_j));
    }
    return out;
  }

 private:
  Profiler& exact_;
};

std::map<std::string, SearchPriorFactory>& prior_registry() {
  static std::map<std::string, SearchPriorFactory> r = {
      {"store",
       [](const PriorContext& c) {
         if (!c.store) throw InvalidInput("the store prior needs a profile store (--db)");
         const ProfileStore* store = c.store;
         const std::string gpu = c.gpu;
         const double before = c.store_snapshot_s;
         return make_store_prior([store, gpu, before](const Partition& p) {
           return store->related(gpu, p.key, p.signature, before);
         });
       }},
      {"emulator",
       [](const PriorContext& c) {
         if (!c.exact) throw InvalidInput("the emulator prior needs a noise-free emulator");
         return make_profiler_prior(*c.exact);
       }},
  };
  return r;
}

std::mutex& prior_registry_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

std::unique_ptr<SearchPrior> make_store_prior(RelatedSource source, std::uint64_t seed) {
  return std::make_unique<StorePrior>(std::move(source), seed);
}

std::unique_ptr<SearchPrior> make_profiler_prior(Profiler& exact) {
  return std::make_unique<ProfilerPrior>(exact);
}

bool register_search_prior(const std::string& name, SearchPriorFactory factory) {
  std::lock_guard<std::mutex> lock(prior_registry_mutex());
  prior_registry()[name] = std::move(factory);
  return true;
}

std::vector<std::string> search_prior_names() {
  std::lock_guard<std::mutex> lock(prior_registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, f] : prior_registry()) names.push_back(name);
  return names;
}

std::unique_ptr<SearchPrior> create_search_prior(const std::string& name, const PriorContext& c) {
  SearchPriorFactory f;
  {
    std::lock_guard<std::mutex> lock(prior_registry_mutex());
    auto it = prior_registry().find(name);
    if (it != prior_registry().end()) f = it->second;
  }
  if (!f) {
    throw InvalidInput(fmt::format("unknown search prior '{}'; available: {}", name,
                                   fmt::join(search_prior_names(), ", ")));
  }
  return f(c);
}

}  // namespace kareus
