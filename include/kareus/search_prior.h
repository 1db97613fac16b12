// Prior knowledge for the search of one partition: a prediction of log time and log energy for
// every configuration, before any of the partition's own points is measured. mbo adds it to its
// additive surrogate with a weight chosen by cross-validation on the partition's own points
// (SearchOptions::prior, docs/search.md "Warm starts"), so a prior that does not match the
// measurements is switched off. Priors share a name registry, like the search strategies:
// `store` (a tree model trained on the measured points of related partitions in the profile
// store: the same partition kind at other shapes) and `emulator` (the emulator's noise-free
// prediction, the prior on real hardware).
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kareus/partition.h"
#include "kareus/profiler.h"
#include "kareus/search_space.h"
#include "kareus/store.h"

namespace kareus {

/// A prior's prediction, parallel to SearchSpace::configs(). Only the shape of the response
/// matters (mbo fits the level from the partition's own points), so values may be centred.
struct PriorPrediction {
  std::vector<double> log_time_s, log_energy_j, log_dynamic_energy_j;
  bool empty() const { return log_time_s.empty(); }
};

class SearchPrior {
 public:
  virtual ~SearchPrior() = default;
  virtual std::string name() const = 0;
  /// The prediction for every configuration of `space`; empty when the prior knows nothing of
  /// this partition (a store without related partitions), and the search runs cold.
  virtual PriorPrediction predict(const Partition& p, const SearchSpace& space) = 0;
};

/// What a prior may use. Pointers are borrowed and must outlive the prior.
struct PriorContext {
  const ProfileStore* store = nullptr;  ///< `store`: the profile store (--db)
  std::string gpu;                      ///< `store`: catalogue name of the GPU searched
  Profiler* exact = nullptr;            ///< `emulator`: a noise-free emulator
  /// `store`: only points measured before this time (seconds since the epoch) count, so that
  /// searches running side by side (`eval --jobs`) see the same store whatever their order.
  double store_snapshot_s = std::numeric_limits<double>::infinity();
};

using SearchPriorFactory = std::function<std::unique_ptr<SearchPrior>(const PriorContext&)>;
/// Registers a prior under `name` (replacing one of that name); returns true so it can
/// initialise a static. Thread-safe, as are the two functions below.
bool register_search_prior(const std::string& name, SearchPriorFactory factory);
/// Creates a prior by name; an unknown name, or a context without what the prior needs, throws
/// InvalidInput (the former listing the valid names).
std::unique_ptr<SearchPrior> create_search_prior(const std::string& name, const PriorContext& c);
std::vector<std::string> search_prior_names();

/// The related partitions of `p` that a store prior trains on (ProfileStore::related, or a
/// benchmark's equivalent in memory).
using RelatedSource = std::function<std::vector<StoredPartition>(const Partition& p)>;

/// The store prior over any source of related partitions. Per source partition the log
/// targets are centred on their mean, so the trees learn the shape of the response (how clock,
/// SMs and slot move it at a given size), not its level. Features: clock as a fraction of the
/// space's fastest, collective SMs, slot position along the chain (0..1), log10 compute FLOPs,
/// log10 compute bytes, log10 collective bytes, collective group size, log10 collective bytes
/// per compute FLOP. The prediction is the additive part of the trees' over the space, a clock
/// effect plus an (SMs, slot) effect (least squares on the full grid).
std::unique_ptr<SearchPrior> make_store_prior(RelatedSource source, std::uint64_t seed = 1);

/// The prior of a profiler's own prediction (`emulator`: a noise-free emulator). `exact` is
/// borrowed.
std::unique_ptr<SearchPrior> make_profiler_prior(Profiler& exact);

/// The weight beta in {0, 1/2, 1} of a prior in log y = beta z + additive model, chosen by
/// 5-fold cross-validation of the additive model on the measured points (`space_index`: each
/// point's index in space.configs(); `z`: the prior at each point; `clock_smoothing` and
/// `choice_pseudo_count`: the additive model's, as in SearchOptions). A tie goes to the smaller
/// weight, so a prior that does not help is off.
double choose_prior_weight(const SearchSpace& space, const std::vector<std::size_t>& space_index,
                           const std::vector<double>& log_y, const std::vector<double>& z,
                           double clock_smoothing, std::uint64_t seed, double choice_pseudo_count);

}  // namespace kareus
