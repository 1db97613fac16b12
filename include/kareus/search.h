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
#include "kareus/search_prior.h"
#include "kareus/search_space.h"
#include "kareus/store.h"
#include "kareus/surrogate.h"

namespace kareus {

struct SearchOptions {
  int budget = 224;  ///< measurements; a budget >= the space size measures it all
  std::uint64_t seed = 1;
  // mbo. The schedule does not depend on the budget (an initial design, then fixed batches), so
  // a search with budget b measures exactly the first b points of one with a larger budget when
  // b falls on a batch boundary (21, 28, 35, ... with the defaults). Why 21 + 7 (the artifact's
  // 96 + 4 x 32, before 28 + 28): a refit every 7 points spends each point on what the ones
  // before it showed; truth-scored over the 84 paper partitions x 3 seeds it raises the mean
  // from 0.9803 / 0.9933 / 0.9976 / 0.9988 to 0.9860 / 0.9958 / 0.9988 / 0.9991 at 28 / 56 /
  // 112 / 224 points (docs/search.md, item 1), for 1.6 s of CPU per 224-point search.
  int initial_points = 21;         ///< initial design size (>= the 18 search clocks of an A100)
  int batch_size = 7;              ///< points per refit
  double share_hvi_total = 0.4;    ///< HVI on (time, total energy)
  double share_hvi_dynamic = 0.2;  ///< HVI on (time, dynamic energy)
  double share_fastest = 0.2;      ///< lowest predicted time
  double share_uncertain = 0.2;    ///< the exploration pass (see `exploration`)
  /// The exploration pass: "optimistic" (greedy HVI on predictions lowered by `optimism`
  /// posterior s.d. of the (SMs, slot) effect, so a choice measured rarely or never is tried;
  /// needs the additive surrogate, "trees" falls back to "spread") or "spread" (the highest
  /// ensemble spread among candidates near the front, the default before).
  std::string exploration = "optimistic";
  double optimism = 1.0;
  /// "lhs" (Latin hypercube over clock, SMs and slot: with at least as many initial points as
  /// clocks, every clock is measured before the first refit) or "random" (the artifact's).
  std::string initial_design = "lhs";
  double stop_threshold = 0;  ///< stop when stop_patience batches in a row each raise the
                              ///< measured hypervolume by less than this fraction (0: never)
  /// 8 batches of 7 (56 points): with 2 or 4, searches on 1%-noisy energies stop too early, and
  /// a partition's worst seed falls from 0.997 to 0.970-0.974 of the true hypervolume
  /// (docs/search.md, "Budget and stopping").
  int stop_patience = 8;
  /// mbo's surrogate: "additive" (a two-way additive model of log time and log dynamic energy
  /// over clock and (SMs, slot), with tree ensembles on its residuals) or "trees" (tree
  /// ensembles on the raw objectives, the artifact's).
  std::string surrogate = "additive";
  /// The additive model's clock effect: penalty on its squared second differences over the
  /// clock (a Whittaker smoother, so adjacent clocks share their points; see strategies.cc);
  /// 0: a free effect per clock.
  double clock_smoothing = 100;
  /// The additive model's (SMs, slot) effects shrink toward 0 as if each had this many more
  /// points at 0 (the posterior mean under a normal prior); -1 (default): empirical Bayes, the
  /// fit's residual variance over the spread of the measured effects, the ratio the
  /// exploration's posterior s.d. already uses (docs/search.md, item 9).
  double choice_pseudo_count = -1;
  /// How mbo picks its recommended front (SearchResult::selected): "smoothed" (Pareto set of
  /// noise-shrunk estimates, see select_front) or "measured" (Pareto set of the raw
  /// measurements, the artifact's choice).
  std::string selection = "smoothed";
  /// Smoothed selection needs this many points; with fewer, the cross-fitted models (each
  /// trained on 4/5 of the points) are worse than the noise they would remove, and the
  /// measured Pareto set is returned (truth-scored benchmark, docs/search.md item 3: with the
  /// smoothed clock effect and per-point weights the smoothed set wins from 28 points on, the
  /// smallest budget measured).
  int smoothing_min_points = 28;
  /// Smoothed selection: weight of the measurement in each estimate, the rest is the
  /// cross-fitted surrogate prediction (1: measured front, 0: prediction only); -1: automatic,
  /// per point and objective, from noise_rel and the number of points behind the prediction
  /// (see select_front).
  double measurement_weight = -1;
  /// Repeatability of one measurement (relative standard deviation of a measured energy), used
  /// by the automatic measurement weight. -1: the profiling backend's (Profiler::noise_rel: the
  /// emulator's --noise), or kMeasuredNoiseRel (an H200's) where the backend does not know it
  /// (real GPUs, traces) and in select_front / smoothed_estimates, which see no backend. With 0
  /// the estimates are the measurements.
  double noise_rel = -1;
  /// The same for a measured time. -1: the backend's (the emulator's --time-noise), or
  /// kTimeNoiseShare x noise_rel when noise_rel is given, else kMeasuredNoiseRel's.
  double time_noise_rel = -1;
  EnsembleParams ensemble;
  /// mbo (additive surrogate only): prior knowledge of the partition's response
  /// (kareus/search_prior.h), shared by every partition of a run. Null: a cold start. Its
  /// prediction z enters as log y = beta z + additive model, beta in {0, 1/2, 1} chosen at
  /// every refit by cross-validation on the partition's own points (choose_prior_weight). The
  /// initial design is measured in two halves; the second follows the prior's predicted front
  /// only where the prior ranked the first as measured (SearchResult::prior_seeded).
  std::shared_ptr<SearchPrior> prior;
};

struct SearchPoint {
  PartitionConfig config;
  Measurement m;
  bool from_store = false;
  /// The variance of m over that of one measurement at the noise the selection assumes
  /// (SearchOptions::noise_rel): 1 for one measurement of the search's own window, more for a
  /// shorter (screening) window, less for the mean of a screening and a full one.
  double noise_var_scale = 1.0;
};

struct SearchResult {
  std::string strategy;
  std::vector<SearchPoint> points;  ///< in measurement order
  int evaluations = 0;              ///< points.size()
  int resumed = 0;                  ///< points that came from the store
  double surrogate_seconds = 0;     ///< model fits and acquisition (excludes measuring)
  int batches = 0;
  bool stopped_early = false;
  /// Indices into points: the configurations the strategy recommends, a Pareto set on
  /// (time_s, energy_j) of its estimates (mbo: select_front; random, exhaustive: front()).
  std::vector<std::size_t> selected;
  /// mbo: the estimated time and energy of every point (parallel to points; see
  /// smoothed_estimates), what the planner composes. Empty for the other strategies: the
  /// measurements are the estimates.
  std::vector<Measurement> estimates;
  /// The estimate of point i: estimates[i], or the measurement when there are none.
  const Measurement& estimate(std::size_t i) const {
    return estimates.empty() ? points[i].m : estimates[i];
  }
  /// mbo with SearchOptions::prior: the prior's name ("none" without one, or when it knew
  /// nothing of the partition), its prediction (parallel to SearchSpace::configs()) and the
  /// weights of its last refit (time, dynamic energy) and of the selection (time, energy).
  std::string prior = "none";
  PriorPrediction prior_prediction;
  double beta_time = 0, beta_dynamic_energy = 0;
  double beta_select_time = 0, beta_select_energy = 0;
  /// The second half of the initial design followed the prior's predicted front (the prior
  /// ranked the first half as measured; see strategies.cc).
  bool prior_seeded = false;
  /// Indices into points: the Pareto set of the measurements on (time_s, energy_j).
  std::vector<std::size_t> front() const;
  /// For every clock, indices of the Pareto-optimal points on (time_s, dynamic_energy_j) of
  /// their estimates.
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

/// The configurations to recommend from measured points (indices into `points`, time
/// ascending): with o.selection == "smoothed", the Pareto set on (time_s, energy_j) of
/// estimates w * m + (1 - w) * p, where m is the measurement, p the prediction of the additive
/// model plus residual trees fitted on the other folds (5-fold cross-fitting, so p never saw
/// m's noise) and w = o.measurement_weight, or with -1, per point and objective, the
/// empirical-Bayes weight (v + tau^2) / (v + tau^2 + noise_rel^2): v is the variance of p's
/// additive part (noise_rel^2 over the number of other points at the point's clock, plus the
/// same at its (SMs, slot) choice) and tau^2 the model's misfit near the front (cross-fitted
/// log residuals of the points nearest it, less the noise and v). Near-ties measured with
/// noise otherwise let lucky draws push truly better configurations off the front.
/// "measured": the Pareto set of the measurements. Fewer than 16 points, or a space of one
/// configuration per clock, fall back to "measured". Deterministic given o.seed. With a
/// non-empty `prior` (SearchResult::prior_prediction) the additive model is fitted to
/// log y - beta z, beta chosen per objective by choose_prior_weight.
std::vector<std::size_t> select_front(const std::vector<SearchPoint>& points,
                                      const SearchSpace& space, const SearchOptions& o,
                                      const PriorPrediction* prior = nullptr);

/// Estimated time and energy of every point (energy split into dynamic and static at the
/// point's own static power), for planning: select_front's estimates with each clock's
/// predictions recentred on the mean log residual of that clock's points, which removes the
/// bias of the smoothed clock effect at kinks (power cap, voltage floor) without reordering
/// the points of a clock. The measurements themselves wherever select_front falls back to
/// "measured".
std::vector<Measurement> smoothed_estimates(const std::vector<SearchPoint>& points,
                                            const SearchSpace& space, const SearchOptions& o,
                                            const PriorPrediction* prior = nullptr);

/// Up to `max_points` configurations at `freq_mhz` not among `points`, the ones the additive
/// model fitted on `points` (log time and log dynamic energy, clock effect smoothed with
/// o.clock_smoothing) predicts on the Pareto front of (time_s, dynamic_energy_j) at that clock;
/// when that front has fewer new members, those of the next front, and so on. Where a layer has
/// more than there is room for, evenly spaced along it in time. Empty when the clock is not in
/// the space. What a planner measures where a plan runs (PlannerOptions::focus_clocks_mhz).
std::vector<PartitionConfig> predicted_clock_front(const std::vector<SearchPoint>& points,
                                                   const SearchSpace& space, const SearchOptions& o,
                                                   int freq_mhz, std::size_t max_points);

/// The repeatability a search assumes: with o.noise_rel given (>= 0), it and o.time_noise_rel
/// (or kTimeNoiseShare of it); otherwise the backend's (Profiler::noise_rel, kMeasuredNoiseRel
/// where it does not know), o.time_noise_rel replacing its time where given.
NoiseRel measurement_noise(const SearchOptions& o, const Profiler& backend);

/// The largest penalty smooth_clock_sweep tries: at it the smoother leaves the least-squares
/// line over the clock.
inline constexpr double kMaxSweepPenalty = 1e6;

/// One measurement per clock of the same work (a segment, a partition at a fixed configuration;
/// freqs_mhz ascending), smoothed across clocks: log time and log energy each by a Whittaker
/// smoother whose penalty minimises the unbiased risk estimate at the given noise (Mallows'
/// Cp), static energy following the smoothed time and dynamic energy the rest. Noise 0, fewer
/// than 4 clocks or a non-positive value return the sweep unchanged. See clock_sweep.cc.
std::vector<Measurement> smooth_clock_sweep(const std::vector<int>& freqs_mhz,
                                            const std::vector<Measurement>& sweep, NoiseRel noise);
/// The same, with the sweep measured at freqs_mhz only and the values wanted at at_mhz (both
/// ascending): clocks without a measurement are filled in by the smoother (the smoothest curve
/// through the measurements, at the chosen penalty). Fewer than 4 measured clocks, or a
/// non-positive value, give each clock the measurement at the nearest measured clock.
std::vector<Measurement> smooth_clock_sweep(const std::vector<int>& freqs_mhz,
                                            const std::vector<Measurement>& sweep, NoiseRel noise,
                                            const std::vector<int>& at_mhz);

/// Normalized hypervolume of measured points on (time_s, energy_j): objectives min-max scaled
/// by `lo`/`hi`, reference point 1.1 in each scaled objective.
double normalized_hypervolume(const std::vector<Point2>& pts, Point2 lo, Point2 hi);

}  // namespace kareus
