// Search of one partition's configuration space for its time-energy Pareto front, with few
// measurements. Strategies share one interface and a name registry: `mbo` (Kareus's multi-pass
// multi-objective Bayesian optimization), `random` and `exhaustive` (baselines measured with the
// same store and metric).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kareus/pareto.h"
#include "kareus/search_space.h"
#include "kareus/store.h"
#include "kareus/surrogate.h"

namespace kareus {

struct SearchOptions {
  int budget = 224;  ///< measurements; a budget >= the space size measures it all
  std::uint64_t seed = 1;
  // mbo. Defaults follow the artifact: 96 random points, then 4 batches of 32.
  int initial_points = 96;                ///< scaled by budget/224 when the budget is smaller
  int batch_size = 32;                    ///< scaled like initial_points (at least 8)
  double share_hvi_total = 0.4;           ///< HVI on (time, total energy)
  double share_hvi_dynamic = 0.2;         ///< HVI on (time, dynamic energy)
  double share_fastest = 0.2;             ///< lowest predicted time
  double share_uncertain = 0.2;           ///< highest ensemble uncertainty
  std::string initial_design = "random";  ///< random or lhs (Latin hypercube over the knobs)
  double stop_threshold = 0;  ///< stop when a batch raises the measured hypervolume by less
                              ///< than this fraction (0: never stop early)
  EnsembleParams ensemble;
};

struct SearchPoint {
  PartitionConfig config;
  Measurement m;
  bool from_store = false;
};

struct SearchResult {
  std::string strategy;
  std::vector<SearchPoint> points;  ///< in measurement order
  int evaluations = 0;              ///< points.size()
  int resumed = 0;                  ///< points that came from the store
  double surrogate_seconds = 0;     ///< model fits and acquisition (excludes measuring)
  int batches = 0;
  bool stopped_early = false;
  /// Indices into points: the Pareto set on (time_s, energy_j).
  std::vector<std::size_t> front() const;
  /// For every clock, indices of the Pareto-optimal points on (time_s, dynamic_energy_j).
  std::map<int, std::vector<std::size_t>> fronts_per_frequency() const;
};

/// Called after each measurement with (done, budget).
using SearchProgress = std::function<void(int, int)>;

/// Strategies measure through CachedProfiler::measure_batch, one call per batch (exhaustive and
/// random: one batch; mbo: the initial design, then each refit's batch), and are deterministic
/// given the seed and the measurements. So in ask mode a run stops at the first batch with
/// missing points (MeasurementsNeeded carries all of them) and a rerun with those points added
/// replays the same choices: ask/tell profiling reaches the front of a direct run.
class SearchStrategy {
 public:
  virtual ~SearchStrategy() = default;
  virtual std::string name() const = 0;
  virtual SearchResult run(const Partition& p, const SearchSpace& space, CachedProfiler& prof,
                           const SearchOptions& o, const SearchProgress& progress) = 0;
};

using SearchStrategyFactory = std::function<std::unique_ptr<SearchStrategy>()>;
/// Registers a strategy under `name` (replacing one of that name); returns true so it can
/// initialise a static. Thread-safe, as are the two functions below.
bool register_search_strategy(const std::string& name, SearchStrategyFactory factory);
/// Creates a strategy by name; an unknown name throws InvalidInput listing the valid names.
std::unique_ptr<SearchStrategy> create_search_strategy(const std::string& name);
std::vector<std::string> search_strategy_names();

/// Normalized hypervolume of measured points on (time_s, energy_j): objectives min-max scaled
/// by `lo`/`hi`, reference point 1.1 in each scaled objective.
double normalized_hypervolume(const std::vector<Point2>& pts, Point2 lo, Point2 hi);

}  // namespace kareus
