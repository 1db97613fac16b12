// Search strategies.
//
// `mbo` is the multi-pass multi-objective Bayesian optimization of Kareus (Wu, Chung, Chowdhury,
// OSDI '26, section 5): gradient-boosted-tree surrogates for time and dynamic energy, a
// bootstrap ensemble for uncertainty, an initial design, then batches filled by several
// passes over the unevaluated candidates, each with its own criterion: hypervolume improvement
// (HVI) of the predicted mean on (time, total energy) and on (time, dynamic energy), lowest
// predicted time, highest uncertainty. Objectives are min-max normalized on the measured points
// and the reference point is 1.1 x the worst observed value. Beyond the artifact: within a pass
// the HVI picks are greedy with the picked predictions added to the front ("Kriging believer",
// Ginsbourger et al. 2010), so one batch does not spend many points on one spot; a
// Latin-hypercube initial design by default (McKay, Beckman, Conover, Technometrics 1979), so
// every clock is measured before the first refit; an additive surrogate (log time and log
// energy as clock effect + (SMs, slot) effect, the clock effect smoothed over adjacent clocks)
// with trees on its residuals; an exploration pass that, with that surrogate, is HVI on
// optimistic predictions (lowered by a posterior s.d. of the (SMs, slot) effect, the
// upper-confidence idea of Srinivas et al., ICML 2010), so a choice never measured is tried
// even when the average choice is poor (Qwen3 1.7B CP `fwd_qkv_ar`: 21 SMs at the `linear`
// slot is 4.5% faster than 18 or 24 and was never measured in 224 points by the spread-based
// pass); smoothed selection of the recommended front (select_front); an optional stopping rule
// on measured hypervolume growth; warm starts (kareus/search_prior.h): a prior's prediction z
// enters the additive model as log y = beta z + effects, beta in {0, 1/2, 1} by cross-
// validation on the partition's own points (choose_prior_weight), and half the initial design
// follows the prior's front only after the prior ranked the other half as measured.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "kareus/error.h"
#include "kareus/interrupt.h"
#include "kareus/search.h"
#include "selection.h"

namespace kareus {

NoiseRel measurement_noise(const SearchOptions& o, const Profiler& backend) {
  if (o.noise_rel >= 0) return noise_with_time_share(o.noise_rel, o.time_noise_rel);
  const NoiseRel b = backend.noise_rel().value_or(kMeasuredNoiseRel);
  return {o.time_noise_rel >= 0 ? o.time_noise_rel : b.time, b.energy};
}

// a = argmin sum_f (n_f a_f^2 - 2 a_f s_f) + penalty |D a|^2, i.e. (diag(n) + penalty D'D) a =
// s, where the rows of D are second divided differences over x scaled by the squared mean step
// (so even steps give (1, -2, 1)). The system is symmetric positive definite once two clocks
// are measured; a tiny ridge keeps it so with one. Dense elimination: a GPU has ~20 clocks.
std::vector<double> whittaker_smooth(const std::vector<double>& x, const std::vector<int>& counts,
                                     const std::vector<double>& sums, double penalty,
                                     double* hat_trace, std::vector<double>* variance_factor) {
  const std::size_t k = x.size();
  std::vector<double> m(k * k, 0.0), a(k, 0.0);
  for (std::size_t f = 0; f < k; ++f) m[f * k + f] = counts[f] + 1e-9;
  if (k >= 3) {
    const double step = (x.back() - x.front()) / static_cast<double>(k - 1);
    for (std::size_t c = 1; c + 1 < k; ++c) {
      const double h1 = x[c] - x[c - 1], h2 = x[c + 1] - x[c];
      const double d[3] = {2 * step * step / (h1 * (h1 + h2)), -2 * step * step / (h1 * h2),
                           2 * step * step / (h2 * (h1 + h2))};
      for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 3; ++j)
          m[(c - 1 + i) * k + (c - 1 + j)] += penalty * d[i] * d[j];
      }
    }
  }
  // Right-hand sides: the sums and, for the hat matrix A^-1 diag(counts), the identity.
  const bool inverse = hat_trace || variance_factor;
  const std::size_t cols = inverse ? k + 1 : 1;
  std::vector<double> rhs(k * cols, 0.0), sol(k * cols, 0.0);
  for (std::size_t r = 0; r < k; ++r) {
    rhs[r * cols] = sums[r];
    if (inverse) rhs[r * cols + 1 + r] = 1;
  }
  // Gaussian elimination without pivoting (the matrix is positive definite).
  for (std::size_t c = 0; c < k; ++c) {
    for (std::size_t r = c + 1; r < k; ++r) {
      const double f = m[r * k + c] / m[c * k + c];
      if (f == 0) continue;
      for (std::size_t j = c; j < k; ++j) m[r * k + j] -= f * m[c * k + j];
      for (std::size_t j = 0; j < cols; ++j) rhs[r * cols + j] -= f * rhs[c * cols + j];
    }
  }
  for (std::size_t c = k; c-- > 0;) {
    for (std::size_t col = 0; col < cols; ++col) {
      double v = rhs[c * cols + col];
      for (std::size_t j = c + 1; j < k; ++j) v -= m[c * k + j] * sol[j * cols + col];
      sol[c * cols + col] = v / m[c * k + c];
    }
  }
  for (std::size_t r = 0; r < k; ++r) a[r] = sol[r * cols];
  if (hat_trace) {
    *hat_trace = 0;
    for (std::size_t r = 0; r < k; ++r) *hat_trace += sol[r * cols + 1 + r] * counts[r];
  }
  // a = A^-1 s and s_g sums counts_g independent draws, so var(a_f) = var(draw) x sum_g
  // (A^-1)_fg^2 counts_g.
  if (variance_factor) {
    variance_factor->assign(k, 0.0);
    for (std::size_t f = 0; f < k; ++f) {
      for (std::size_t g = 0; g < k; ++g)
        (*variance_factor)[f] += std::pow(sol[f * cols + 1 + g], 2) * counts[g];
    }
  }
  return a;
}

std::vector<double> whittaker_clock_effect(const std::vector<int>& freqs_mhz,
                                           const std::vector<int>& counts,
                                           const std::vector<double>& sums, double penalty) {
  return whittaker_smooth(std::vector<double>(freqs_mhz.begin(), freqs_mhz.end()), counts, sums,
                          penalty);
}

std::vector<std::size_t> SearchResult::front() const {
  std::vector<Point2> pts;
  for (const auto& p : points) pts.push_back({p.m.time_s, p.m.energy_j});
  return pareto_front(pts);
}

std::map<int, std::vector<std::size_t>> SearchResult::fronts_per_frequency() const {
  std::map<int, std::vector<std::size_t>> groups, out;
  for (std::size_t i = 0; i < points.size(); ++i) groups[points[i].config.freq_mhz].push_back(i);
  for (const auto& [f, idx] : groups) {
    std::vector<Point2> pts;
    for (std::size_t i : idx) pts.push_back({estimate(i).time_s, estimate(i).dynamic_energy_j});
    for (std::size_t j : pareto_front(pts)) out[f].push_back(idx[j]);
  }
  return out;
}

double normalized_hypervolume(const std::vector<Point2>& pts, Point2 lo, Point2 hi) {
  const double sx = hi.x > lo.x ? hi.x - lo.x : 1.0, sy = hi.y > lo.y ? hi.y - lo.y : 1.0;
  std::vector<Point2> n;
  n.reserve(pts.size());
  for (const auto& p : pts) n.push_back({(p.x - lo.x) / sx, (p.y - lo.y) / sy});
  return hypervolume_2d(n, {1.1, 1.1});
}

namespace {

// Shared bookkeeping: measuring through the cached profiler and recording where points came from.
class Recorder {
 public:
  Recorder(const Partition& p, const SearchSpace& s, CachedProfiler& prof, int budget,
           const SearchProgress& progress)
      : part_(p),
        space_(s),
        prof_(prof),
        budget_(budget),
        progress_(progress),
        taken_(s.size(), false) {}

  // One batch through one CachedProfiler call, so that ask/tell profiling can ask for the whole
  // batch at once; points are recorded as they are served, in the batch's order.
  void measure_batch(const std::vector<std::size_t>& batch) {
    throw_if_interrupted();  // a stop lands before the next batch, not only at a measurement
    std::vector<std::size_t> idx;
    std::vector<PartitionConfig> configs;
    std::vector<bool> from_store, in_batch(taken_.size(), false);
    for (std::size_t i : batch) {
      if (taken_[i] || in_batch[i]) continue;
      in_batch[i] = true;
      idx.push_back(i);
      configs.push_back(space_.at(i));
      from_store.push_back(prof_.stored(part_, configs.back()));
    }
    prof_.measure_batch(part_, configs, [&](std::size_t j, const Measurement& m) {
      taken_[idx[j]] = true;
      SearchPoint sp;
      sp.config = configs[j];
      sp.from_store = from_store[j];
      sp.m = m;
      result.points.push_back(sp);
      order.push_back(idx[j]);
      if (sp.from_store) ++result.resumed;
      result.evaluations = static_cast<int>(result.points.size());
      if (progress_) progress_(result.evaluations, budget_);
    });
  }
  bool taken(std::size_t idx) const { return taken_[idx]; }

  SearchResult result;
  std::vector<std::size_t> order;  ///< candidate index of every measured point

 private:
  const Partition& part_;
  const SearchSpace& space_;
  CachedProfiler& prof_;
  int budget_;
  const SearchProgress& progress_;
  std::vector<bool> taken_;
};

std::vector<std::size_t> shuffled(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  return idx;
}

class ExhaustiveSearch : public SearchStrategy {
 public:
  std::string name() const override { return "exhaustive"; }
  SearchResult run(const Partition& p, const SearchSpace& space, CachedProfiler& prof,
                   const SearchOptions&, const SearchProgress& progress) override {
    Recorder rec(p, space, prof, static_cast<int>(space.size()), progress);
    std::vector<std::size_t> all(space.size());
    std::iota(all.begin(), all.end(), 0);
    rec.measure_batch(all);
    rec.result.strategy = name();
    rec.result.selected = rec.result.front();
    return rec.result;
  }
};

class RandomSearch : public SearchStrategy {
 public:
  std::string name() const override { return "random"; }
  SearchResult run(const Partition& p, const SearchSpace& space, CachedProfiler& prof,
                   const SearchOptions& o, const SearchProgress& progress) override {
    const std::size_t n =
        std::min<std::size_t>(static_cast<std::size_t>(std::max(o.budget, 0)), space.size());
    Recorder rec(p, space, prof, static_cast<int>(n), progress);
    auto order = shuffled(space.size(), o.seed);
    order.resize(n);
    rec.measure_batch(order);
    rec.result.strategy = name();
    rec.result.selected = rec.result.front();
    return rec.result;
  }
};

// Smallest e such that q - (e, e) is not dominated by the front (0 if q is not dominated).
double epsilon_behind(const std::vector<Point2>& front, Point2 q) {
  double eps = std::numeric_limits<double>::infinity();
  for (const auto& f : front) eps = std::min(eps, std::max({0.0, q.x - f.x, q.y - f.y}));
  return front.empty() ? 0.0 : eps;
}

// One objective min-max normalized on the measured points: (v - lo) / scale.
struct Scale {
  double lo = 0, scale = 1;
  static Scale of(const std::vector<double>& v) {  // v non-empty
    const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
    return {*mn, std::max(*mx - *mn, 1e-300)};
  }
  double operator()(double v) const { return (v - lo) / scale; }
};

// Features of a configuration: clock (column 0, so monotone constraints can name it), SMs,
// launch slot as its position (slots are ordered along the partition's ops) and one-hot.
void config_features(const SearchSpace& space, const PartitionConfig& c, float* row) {
  row[0] = static_cast<float>(c.freq_mhz);
  row[1] = static_cast<float>(c.sms);
  const auto slot = std::find(space.slots.begin(), space.slots.end(), c.slot);
  const auto k = static_cast<std::size_t>(slot - space.slots.begin());
  row[2] = static_cast<float>(k);
  if (k < space.slots.size()) row[3 + k] = 1.0f;
}

std::size_t feature_count(const SearchSpace& space) { return 3 + space.slots.size(); }

// XGBoost monotone_constraints for a time model: non-increasing in the clock (column 0), free
// in the other features.
std::string monotone_in_clock(std::size_t cols) {
  std::string s = "(-1";
  for (std::size_t i = 1; i < cols; ++i) s += ",0";
  return s + ")";
}

Matrix candidate_features(const SearchSpace& space) {
  Matrix all;
  all.rows = space.size();
  all.cols = feature_count(space);
  all.data.assign(all.rows * all.cols, 0.0f);
  for (std::size_t i = 0; i < all.rows; ++i) {
    config_features(space, space.at(i), all.data.data() + i * all.cols);
  }
  return all;
}

// Position of a configuration in the space's clock list and its (SMs, slot) combination:
// the two factors of the additive model below.
struct Levels {
  std::size_t freq = 0, combo = 0;
};

Levels levels_of(const SearchSpace& space, const PartitionConfig& c) {
  auto pos = [](const auto& v, const auto& x) {
    return static_cast<std::size_t>(std::find(v.begin(), v.end(), x) - v.begin());
  };
  return {pos(space.freqs_mhz, c.freq_mhz),
          pos(space.sms, c.sms) * space.slots.size() + pos(space.slots, c.slot)};
}

// Two-way additive model of log(y): log y = mu + a[clock] + b[SMs, slot] (Tukey's two-way
// layout, fitted by backfitting; Hastie & Tibshirani, Generalized Additive Models, 1990). Why:
// the clock scales the compute of every configuration by about the same factor, so the relative
// merit of an (SMs, slot) choice carries over from the clocks where it was measured to those
// where it was not, which trees on raw values learn only from many points. Effects of the
// (SMs, slot) choices shrink toward 0 with a pseudo-count (an unseen combination predicts the
// average): SearchOptions::choice_pseudo_count, or with -1 the empirical-Bayes ratio of the
// residual variance to the effects' spread (Efron & Morris, JASA 1973). Why the latter: the
// effects span tens of percent (3 SMs leave a collective exposed) where the noise is 1%, and one
// pseudo-point keeps half of a once-measured choice's effect out of b; backfitting hands that
// half to its clock's effect, which the smoother spreads to the neighbouring clocks. The clock
// effect is a Whittaker smoother (Eilers, Analytical Chemistry 2003): it minimizes the squared
// residuals plus `clock_penalty` times the squared second differences of a over the clock (divided
// differences, so uneven clock lists work), so adjacent clocks share their points. Why: with a
// dozen noisy points per clock, free per-clock effects are off by about 0.3% each, as large as the
// differences between adjacent clocks that decide which end of the front a point belongs to; time
// and energy are smooth in the clock. A penalty of 0 gives free effects, with unseen clocks
// interpolated linearly between measured neighbours. Trees then fit what this model leaves (kinks
// such as the power cap).
class AdditiveModel {
 public:
  AdditiveModel(const SearchSpace& space, double clock_penalty, double choice_pseudo_count)
      : freqs_(space.freqs_mhz),
        penalty_(clock_penalty),
        pseudo_(choice_pseudo_count),
        a_(space.freqs_mhz.size(), 0.0),
        b_(space.sms.size() * space.slots.size(), 0.0) {}

  void fit(const std::vector<Levels>& lv, const std::vector<double>& log_y) {
    constexpr int kSweeps = 8;
    // Empirical Bayes starts from one pseudo-point and re-estimates the ratio after each sweep.
    double pseudo = pseudo_ < 0 ? 1.0 : pseudo_;
    mu_ = 0;
    for (double v : log_y) mu_ += v;
    mu_ /= static_cast<double>(std::max<std::size_t>(1, log_y.size()));
    std::vector<double> sa(a_.size()), sb(b_.size());
    std::vector<int> na(a_.size()), nb(b_.size());
    for (const auto& l : lv) {
      ++na[l.freq];
      ++nb[l.combo];
    }
    for (int sweep = 0; sweep < kSweeps; ++sweep) {
      std::fill(sa.begin(), sa.end(), 0.0);
      for (std::size_t i = 0; i < lv.size(); ++i)
        sa[lv[i].freq] += log_y[i] - mu_ - b_[lv[i].combo];
      if (penalty_ > 0) {
        a_ = whittaker_clock_effect(freqs_, na, sa, penalty_);
      } else {
        for (std::size_t f = 0; f < a_.size(); ++f) a_[f] = na[f] ? sa[f] / na[f] : 0.0;
      }
      std::fill(sb.begin(), sb.end(), 0.0);
      for (std::size_t i = 0; i < lv.size(); ++i)
        sb[lv[i].combo] += log_y[i] - mu_ - a_[lv[i].freq];
      for (std::size_t c = 0; c < b_.size(); ++c) b_[c] = sb[c] / (nb[c] + pseudo);
      if (pseudo_ < 0) {
        const double r2 = residual_var(lv, log_y);
        pseudo = r2 / effect_var(nb, r2);
      }
    }
    if (penalty_ <= 0) interpolate_unseen_clocks(na);
    // Spread of the (SMs, slot) effects: the residual variance r2 per point and the effects'
    // own variance as their prior (at least r2).
    nb_ = nb;
    r2_ = residual_var(lv, log_y);
    prior2_ = effect_var(nb, r2_);
  }
  double predict(const Levels& l) const { return mu_ + a_[l.freq] + b_[l.combo]; }
  // Mean squared residual per point (at least 1e-12).
  double residual_var(const std::vector<Levels>& lv, const std::vector<double>& log_y) const {
    double ss = 0;
    for (std::size_t i = 0; i < lv.size(); ++i) ss += std::pow(log_y[i] - predict(lv[i]), 2);
    return std::max(ss / static_cast<double>(std::max<std::size_t>(1, lv.size())), 1e-12);
  }
  // Mean square of the measured choices' effects, at least r2: their prior variance.
  double effect_var(const std::vector<int>& nb, double r2) const {
    double sb2 = 0, seen = 0;
    for (std::size_t c = 0; c < b_.size(); ++c) {
      if (nb[c] == 0) continue;
      sb2 += b_[c] * b_[c];
      ++seen;
    }
    return std::max(sb2 / std::max(1.0, seen), r2);
  }
  // Posterior s.d. of the (SMs, slot) effect at l (normal prior and noise): the prior's for a
  // choice never measured, shrinking as its points accumulate.
  double combo_sd(const Levels& l) const {
    return std::sqrt(1.0 / (nb_[l.combo] / r2_ + 1.0 / prior2_));
  }

 private:
  // Free clock effects: a clock without a measurement is linear in the clock between measured
  // neighbours, flat beyond the measured range.
  void interpolate_unseen_clocks(const std::vector<int>& na) {
    for (std::size_t f = 0; f < a_.size(); ++f) {
      if (na[f]) continue;
      std::size_t lo = a_.size(), hi = a_.size();
      for (std::size_t g = 0; g < a_.size(); ++g) {
        if (!na[g]) continue;
        if (freqs_[g] < freqs_[f] && (lo == a_.size() || freqs_[g] > freqs_[lo])) lo = g;
        if (freqs_[g] > freqs_[f] && (hi == a_.size() || freqs_[g] < freqs_[hi])) hi = g;
      }
      if (lo < a_.size() && hi < a_.size()) {
        const double u = static_cast<double>(freqs_[f] - freqs_[lo]) / (freqs_[hi] - freqs_[lo]);
        a_[f] = a_[lo] + u * (a_[hi] - a_[lo]);
      } else if (lo < a_.size() || hi < a_.size()) {
        a_[f] = a_[lo < a_.size() ? lo : hi];
      }
    }
  }

  std::vector<int> freqs_;
  double penalty_ = 0;
  double pseudo_ = -1;  ///< SearchOptions::choice_pseudo_count
  double mu_ = 0;
  std::vector<double> a_, b_;
  std::vector<int> nb_;
  double r2_ = 1, prior2_ = 1;
};

double safe_log(double v) { return std::log(std::max(v, 1e-300)); }

Levels levels_at(const SearchSpace& space, std::size_t index) {
  const std::size_t combos = space.sms.size() * space.slots.size();
  return {index / combos, index % combos};
}

std::size_t index_of(const SearchSpace& space, const Levels& l) {
  return l.freq * space.sms.size() * space.slots.size() + l.combo;
}

}  // namespace

// Cross-validated choice among three weights only: a finer grid would fit the noise of a few
// dozen points, and the three cover the cases that matter (the prior is wrong: 0; it has the
// right shape: 1; it is half right, e.g. the response is flatter than predicted: 1/2). The
// folds are seeded; a weight wins only by a strictly lower held-out error, so equal errors (a
// flat prior) keep the cold model.
double choose_prior_weight(const SearchSpace& space, const std::vector<std::size_t>& space_index,
                           const std::vector<double>& log_y, const std::vector<double>& z,
                           double clock_smoothing, std::uint64_t seed, double choice_pseudo_count) {
  constexpr std::size_t kWeightFolds = 5;
  const std::size_t n = log_y.size();
  if (n < 2 * kWeightFolds || z.size() != n || space_index.size() != n) return 0;
  std::vector<Levels> lv(n);
  for (std::size_t i = 0; i < n; ++i) lv[i] = levels_at(space, space_index[i]);
  const auto order = shuffled(n, seed ^ 0x2545f4914f6cdd1dULL);
  std::vector<std::size_t> fold(n);
  for (std::size_t r = 0; r < n; ++r) fold[order[r]] = r % kWeightFolds;
  double best = 0, best_err = std::numeric_limits<double>::infinity();
  for (const double beta : {0.0, 0.5, 1.0}) {
    double err = 0;
    for (std::size_t k = 0; k < kWeightFolds; ++k) {
      std::vector<Levels> lv_tr;
      std::vector<double> y_tr;
      for (std::size_t i = 0; i < n; ++i) {
        if (fold[i] == k) continue;
        lv_tr.push_back(lv[i]);
        y_tr.push_back(log_y[i] - beta * z[i]);
      }
      AdditiveModel am(space, clock_smoothing, choice_pseudo_count);
      am.fit(lv_tr, y_tr);
      for (std::size_t i = 0; i < n; ++i) {
        if (fold[i] == k) err += std::pow(log_y[i] - beta * z[i] - am.predict(lv[i]), 2);
      }
    }
    if (err < best_err * (1 - 1e-9)) {
      best = beta;
      best_err = err;
    }
  }
  return best;
}

std::vector<double> additive_model_fit(const SearchSpace& space,
                                       const std::vector<PartitionConfig>& configs,
                                       const std::vector<double>& log_y, double clock_smoothing,
                                       double choice_pseudo_count) {
  std::vector<Levels> lv;
  lv.reserve(configs.size());
  for (const auto& c : configs) lv.push_back(levels_of(space, c));
  AdditiveModel am(space, clock_smoothing, choice_pseudo_count);
  am.fit(lv, log_y);
  std::vector<double> out;
  out.reserve(space.size());
  for (std::size_t i = 0; i < space.size(); ++i) out.push_back(am.predict(levels_at(space, i)));
  return out;
}

namespace {

// What select_front ranks (time_s, energy_j) and the values handed on (smoothed_estimates), one
// of each per point.
struct Estimates {
  std::vector<Point2> ranking;
  std::vector<Measurement> values;
  double beta_time = 0, beta_energy = 0;  ///< the prior's weights, 0 without one
};
Estimates estimate_points(const std::vector<SearchPoint>& points, const SearchSpace& space,
                          const SearchOptions& o, const PriorPrediction* prior);

NoiseRel noise_rel_of(const SearchOptions& o) {
  if (o.noise_rel >= 0) return noise_with_time_share(o.noise_rel, o.time_noise_rel);
  return {o.time_noise_rel >= 0 ? o.time_noise_rel : kMeasuredNoiseRel.time,
          kMeasuredNoiseRel.energy};
}

// One batch of mbo: surrogates fitted on the measured points predict every unevaluated
// candidate; then the passes (HVI on total and on dynamic energy, fastest, uncertain) pick.
class BatchSelector {
 public:
  BatchSelector(const Matrix& all, const Recorder& rec, const SearchSpace& space,
                const SearchOptions& o, double p_static, std::uint64_t seed,
                const PriorPrediction* prior)
      : pts_(rec.result.points), prior_(prior && !prior->empty() ? prior : nullptr) {
    for (const auto& p : pts_) {
      t_.push_back(p.m.time_s);
      d_.push_back(p.m.dynamic_energy_j);
      e_.push_back(p.m.energy_j);
    }
    ts_ = Scale::of(t_);
    ds_ = Scale::of(d_);
    es_ = Scale::of(e_);
    for (std::size_t i = 0; i < all.rows; ++i) {
      if (!rec.taken(i)) cand_.push_back(i);
    }
    fit_and_predict(all, rec, space, o, p_static, seed);
    chosen_.assign(cand_.size(), false);
  }

  double beta_time() const { return beta_t_; }
  double beta_dynamic_energy() const { return beta_d_; }

  std::vector<std::size_t> select(std::size_t b, const SearchOptions& o) {
    const std::size_t k1 = static_cast<std::size_t>(std::llround(b * o.share_hvi_total));
    const std::size_t k2 = std::min(
        b - std::min(b, k1), static_cast<std::size_t>(std::llround(b * o.share_hvi_dynamic)));
    const std::size_t k3 = std::min(b - std::min(b, k1 + k2),
                                    static_cast<std::size_t>(std::llround(b * o.share_fastest)));
    const std::size_t k4 = b - std::min(b, k1 + k2 + k3);
    hvi_pass(k1, pt_, pe_, es_, e_);
    hvi_pass(k2, pt_, pd_, ds_, d_);
    rank_pass(k3, [&](std::size_t j) { return pt_[j]; });
    if (optimistic_) {
      hvi_pass(k4, ot_, oe_, es_, e_);
    } else {
      uncertainty_pass(k4);
    }
    // Rounding or an exhausted pass can leave the batch short: fill by total-energy HVI.
    if (batch_.size() < b) hvi_pass(b - batch_.size(), pt_, pe_, es_, e_);
    return batch_;
  }

 private:
  // "trees" (the artifact): trees on min-max normalized targets. "additive": the two-way
  // additive model of log time and log dynamic energy, trees on its standardized residuals.
  // Predictions back in physical units.
  void fit_and_predict(const Matrix& all, const Recorder& rec, const SearchSpace& space,
                       const SearchOptions& o, double p_static, std::uint64_t seed) {
    const bool additive = o.surrogate == "additive";
    AdditiveModel at(space, o.clock_smoothing, o.choice_pseudo_count),
        ad(space, o.clock_smoothing, o.choice_pseudo_count);
    std::vector<Levels> lv;
    for (std::size_t i = 0; i < pts_.size(); ++i) lv.push_back(levels_of(space, pts_[i].config));
    std::vector<double> lt, ld;
    for (std::size_t i = 0; i < pts_.size(); ++i) {
      lt.push_back(safe_log(t_[i]));
      ld.push_back(safe_log(d_[i]));
    }
    double rt_sd = 1, rd_sd = 1;
    if (additive && prior_) {
      // The prior's part, beta z, comes off the targets; what is left is fitted as without a
      // prior, and beta z is added back to every prediction.
      std::vector<double> zt, zd;
      for (std::size_t i = 0; i < pts_.size(); ++i) {
        zt.push_back(prior_->log_time_s[rec.order[i]]);
        zd.push_back(prior_->log_dynamic_energy_j[rec.order[i]]);
      }
      beta_t_ = choose_prior_weight(space, rec.order, lt, zt, o.clock_smoothing, seed,
                                    o.choice_pseudo_count);
      beta_d_ = choose_prior_weight(space, rec.order, ld, zd, o.clock_smoothing, seed + 1,
                                    o.choice_pseudo_count);
      for (std::size_t i = 0; i < pts_.size(); ++i) {
        lt[i] -= beta_t_ * zt[i];
        ld[i] -= beta_d_ * zd[i];
      }
    }
    if (additive) {
      at.fit(lv, lt);
      ad.fit(lv, ld);
      double st = 0, sd = 0;
      for (std::size_t i = 0; i < pts_.size(); ++i) {
        st += std::pow(lt[i] - at.predict(lv[i]), 2);
        sd += std::pow(ld[i] - ad.predict(lv[i]), 2);
      }
      const double n = static_cast<double>(std::max<std::size_t>(1, pts_.size()));
      rt_sd = std::max(std::sqrt(st / n), 1e-12);
      rd_sd = std::max(std::sqrt(sd / n), 1e-12);
    }
    Matrix x;
    x.rows = pts_.size();
    x.cols = all.cols;
    std::vector<float> yt, yd;
    for (std::size_t i = 0; i < pts_.size(); ++i) {
      const float* r = all.row(rec.order[i]);
      x.data.insert(x.data.end(), r, r + all.cols);
      if (additive) {
        yt.push_back(static_cast<float>((lt[i] - at.predict(lv[i])) / rt_sd));
        yd.push_back(static_cast<float>((ld[i] - ad.predict(lv[i])) / rd_sd));
      } else {
        yt.push_back(static_cast<float>(ts_(t_[i])));
        yd.push_back(static_cast<float>(ds_(d_[i])));
      }
    }
    BootstrapEnsemble et(o.ensemble, seed * 2 + 1), ed(o.ensemble, seed * 2 + 2);
    et.fit(x, yt);
    ed.fit(x, yd);
    Matrix cx;
    cx.rows = cand_.size();
    cx.cols = all.cols;
    for (std::size_t i : cand_) cx.data.insert(cx.data.end(), all.row(i), all.row(i) + all.cols);
    std::vector<double> mt, md;
    et.predict(cx, mt, st_);
    ed.predict(cx, md, sd_);
    pt_.resize(cand_.size());
    pd_.resize(cand_.size());
    pe_.resize(cand_.size());
    optimistic_ = additive && o.exploration == "optimistic";
    if (additive) {
      ot_.resize(cand_.size());
      oe_.resize(cand_.size());
    }
    for (std::size_t j = 0; j < cand_.size(); ++j) {
      if (additive) {
        const Levels l = levels_of(space, space.at(cand_[j]));
        const double zt = prior_ ? beta_t_ * prior_->log_time_s[cand_[j]] : 0.0;
        const double zd = prior_ ? beta_d_ * prior_->log_dynamic_energy_j[cand_[j]] : 0.0;
        pt_[j] = std::exp(at.predict(l) + zt + mt[j] * rt_sd);
        pd_[j] = std::exp(ad.predict(l) + zd + md[j] * rd_sd);
        // Spreads in relative units, comparable to the normalized ones of "trees".
        st_[j] = st_[j] * rt_sd * pt_[j] / ts_.scale;
        sd_[j] = sd_[j] * rd_sd * pd_[j] / ds_.scale;
        // Optimistic values for the exploration pass: lowered by `optimism` posterior s.d. of
        // the (SMs, slot) effect.
        ot_[j] = pt_[j] * std::exp(-o.optimism * at.combo_sd(l));
        oe_[j] = pd_[j] * std::exp(-o.optimism * ad.combo_sd(l)) + p_static * ot_[j];
      } else {
        pt_[j] = ts_.lo + mt[j] * ts_.scale;
        pd_[j] = ds_.lo + md[j] * ds_.scale;
      }
      pe_[j] = pd_[j] + p_static * pt_[j];
    }
  }

  void choose(std::size_t j) {
    chosen_[j] = true;
    batch_.push_back(cand_[j]);
  }

  // Greedy hypervolume improvement on (time, y): each pick joins the front as if measured
  // ("Kriging believer"), so the next pick goes elsewhere.
  void hvi_pass(std::size_t k, const std::vector<double>& ptime, const std::vector<double>& py,
                const Scale& ys, const std::vector<double>& measured_y) {
    std::vector<Point2> front_pts;
    for (std::size_t i = 0; i < pts_.size(); ++i) {
      front_pts.push_back({ts_(t_[i]), ys(measured_y[i])});
    }
    Front2 front(front_pts, {1.1, 1.1});
    for (std::size_t n = 0; n < k && batch_.size() < cand_.size(); ++n) {
      std::size_t best = cand_.size();
      double best_score = -1e300;
      for (std::size_t j = 0; j < cand_.size(); ++j) {
        if (chosen_[j]) continue;
        const Point2 q{ts_(ptime[j]), ys(py[j])};
        const double g = front.improvement(q);
        // Predicted-dominated candidates rank by how far they sit behind the front (additive
        // epsilon indicator, Zitzler et al., IEEE TEC 2003): measurement noise and model error
        // make the nearest ones the likeliest to land on the measured front.
        const double score = g > 0 ? g : -epsilon_behind(front.points(), q);
        if (score > best_score) {
          best = j;
          best_score = score;
        }
      }
      if (best == cand_.size()) return;
      choose(best);
      front.add({ts_(ptime[best]), ys(py[best])});
    }
  }

  // The k unchosen candidates of lowest score (stable: ties keep candidate order).
  void rank_pass(std::size_t k, const std::function<double(std::size_t)>& score) {
    std::vector<std::size_t> order;
    for (std::size_t j = 0; j < cand_.size(); ++j) {
      if (!chosen_[j]) order.push_back(j);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t c) { return score(a) < score(c); });
    for (std::size_t n = 0; n < k && n < order.size(); ++n) choose(order[n]);
  }

  // Uncertainty among plausible candidates only: those whose predicted point lies in the
  // nearer half behind the measured (time, total energy) front. Far-dominated corners (the
  // lowest clocks below the voltage floor) are uncertain but cannot join the front.
  void uncertainty_pass(std::size_t k) {
    std::vector<Point2> measured_e;
    for (std::size_t i = 0; i < pts_.size(); ++i) measured_e.push_back({ts_(t_[i]), es_(e_[i])});
    const Front2 fe(measured_e, {1.1, 1.1});
    std::vector<double> behind(cand_.size());
    for (std::size_t j = 0; j < cand_.size(); ++j) {
      behind[j] = epsilon_behind(fe.points(), {ts_(pt_[j]), es_(pe_[j])});
    }
    std::vector<double> sorted_behind = behind;
    std::nth_element(sorted_behind.begin(), sorted_behind.begin() + sorted_behind.size() / 2,
                     sorted_behind.end());
    const double median_behind =
        sorted_behind.empty() ? 0 : sorted_behind[sorted_behind.size() / 2];
    rank_pass(k, [&](std::size_t j) {
      return (behind[j] <= median_behind ? 0.0 : 1e6) - (st_[j] + sd_[j]);
    });
  }

  const std::vector<SearchPoint>& pts_;
  const PriorPrediction* prior_;      ///< null: cold
  double beta_t_ = 0, beta_d_ = 0;    ///< the prior's weights (choose_prior_weight)
  std::vector<double> t_, d_, e_;     ///< measured time, dynamic and total energy
  Scale ts_, ds_, es_;                ///< their normalizations
  std::vector<std::size_t> cand_;     ///< unevaluated candidate indices
  std::vector<double> pt_, pd_, pe_;  ///< predicted time, dynamic and total energy
  std::vector<double> st_, sd_;       ///< predicted spreads (normalized)
  std::vector<double> ot_, oe_;       ///< optimistic time and total energy (additive surrogate)
  bool optimistic_ = false;           ///< the exploration pass is optimistic HVI
  std::vector<bool> chosen_;
  std::vector<std::size_t> batch_;
};

enum class InitialDesign { kRandom, kLatinHypercube };

InitialDesign initial_design_of(const SearchOptions& o) {
  if (o.initial_design == "random") return InitialDesign::kRandom;
  if (o.initial_design == "lhs") return InitialDesign::kLatinHypercube;
  throw InvalidInput(fmt::format("--initial-design '{}': allowed random, lhs", o.initial_design));
}

class MboSearch : public SearchStrategy {
 public:
  std::string name() const override { return "mbo"; }

  SearchResult run(const Partition& part, const SearchSpace& space, CachedProfiler& prof,
                   const SearchOptions& options, const SearchProgress& progress) override {
    validate(options);
    SearchOptions o = options;
    const NoiseRel noise = measurement_noise(o, prof.backend());
    o.noise_rel = noise.energy;
    o.time_noise_rel = noise.time;
    const std::size_t total = space.size();
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(o.budget), total);
    Recorder rec(part, space, prof, static_cast<int>(n), progress);
    rec.result.strategy = name();
    const double p_static = prof.backend().static_power_w();

    const Matrix all = candidate_features(space);
    if (o.prior) {
      rec.result.prior_prediction = o.prior->predict(part, space);
      if (!rec.result.prior_prediction.empty()) {
        if (rec.result.prior_prediction.log_time_s.size() != total ||
            rec.result.prior_prediction.log_energy_j.size() != total ||
            rec.result.prior_prediction.log_dynamic_energy_j.size() != total) {
          throw InternalError(fmt::format("prior '{}' predicted {} of {} configurations",
                                          o.prior->name(),
                                          rec.result.prior_prediction.log_time_s.size(), total));
        }
        rec.result.prior = o.prior->name();
      }
    }
    const PriorPrediction* prior =
        rec.result.prior_prediction.empty() ? nullptr : &rec.result.prior_prediction;

    // Initial design, then fixed batches: the schedule does not depend on the budget, so a
    // smaller budget measures a prefix of a larger one's points (and benchmarks score every
    // budget from one run).
    const std::size_t init = std::min<std::size_t>(n, static_cast<std::size_t>(o.initial_points));
    const auto design = initial_design(space, init, o);
    if (prior && init >= 2 * kPriorCheckPoints) {
      // Half the design first; the other half goes to the prior's predicted front only where
      // the prior ranks those first points as they were measured (see seeded_half).
      const std::vector<std::size_t> first(design.begin(), design.begin() + init / 2);
      rec.measure_batch(first);
      rec.measure_batch(
          seeded_half(space, rec, *prior, init)
              .value_or(std::vector<std::size_t>(design.begin() + init / 2, design.end())));
      rec.result.prior_seeded =
          rec.order.size() == init &&
          !std::equal(rec.order.begin() + init / 2, rec.order.end(), design.begin() + init / 2);
    } else {
      rec.measure_batch(design);
    }
    const std::size_t batch_size = static_cast<std::size_t>(o.batch_size);
    std::uint64_t batch_seed = o.seed;
    int flat_batches = 0;
    while (rec.result.points.size() < n) {
      const std::size_t b = std::min<std::size_t>(batch_size, n - rec.result.points.size());
      const std::size_t before = rec.result.points.size();
      const auto t0 = std::chrono::steady_clock::now();
      BatchSelector sel(all, rec, space, o, p_static, ++batch_seed, prior);
      const auto batch = sel.select(b, o);
      rec.result.beta_time = sel.beta_time();
      rec.result.beta_dynamic_energy = sel.beta_dynamic_energy();
      rec.result.surrogate_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rec.measure_batch(batch);
      ++rec.result.batches;
      if (o.stop_threshold > 0) {
        flat_batches = batch_gain(rec.result, before) < o.stop_threshold ? flat_batches + 1 : 0;
        if (flat_batches >= o.stop_patience) {
          rec.result.stopped_early = rec.result.points.size() < n;
          break;
        }
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    Estimates est = estimate_points(rec.result.points, space, o, prior);
    rec.result.beta_select_time = est.beta_time;
    rec.result.beta_select_energy = est.beta_energy;
    rec.result.selected = pareto_front(est.ranking);
    rec.result.estimates = std::move(est.values);
    rec.result.surrogate_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rec.result;
  }

 private:
  static void validate(const SearchOptions& o) {
    auto bad = [](const std::string& what) { throw InvalidInput(what); };
    if (o.budget < 1) bad(fmt::format("--budget must be >= 1, got {}", o.budget));
    if (o.batch_size < 1) bad(fmt::format("--batch-size must be >= 1, got {}", o.batch_size));
    if (o.initial_points < 1)
      bad(fmt::format("--initial-points must be >= 1, got {}", o.initial_points));
    const double shares =
        o.share_hvi_total + o.share_hvi_dynamic + o.share_fastest + o.share_uncertain;
    if (o.share_hvi_total < 0 || o.share_hvi_dynamic < 0 || o.share_fastest < 0 ||
        o.share_uncertain < 0 || std::abs(shares - 1.0) > 1e-6) {
      bad(fmt::format("pass shares must be >= 0 and sum to 1, got {} + {} + {} + {}",
                      o.share_hvi_total, o.share_hvi_dynamic, o.share_fastest, o.share_uncertain));
    }
    initial_design_of(o);  // throws on an unknown name
    if (o.surrogate != "additive" && o.surrogate != "trees") {
      bad(fmt::format("--surrogate '{}': allowed additive, trees", o.surrogate));
    }
    if (o.prior && o.surrogate != "additive") {
      bad(fmt::format("a prior ('{}') needs --surrogate additive", o.prior->name()));
    }
    if (o.selection != "smoothed" && o.selection != "measured") {
      bad(fmt::format("--selection '{}': allowed smoothed, measured", o.selection));
    }
    if (!(o.measurement_weight >= 0 && o.measurement_weight <= 1) && o.measurement_weight != -1) {
      bad(fmt::format("--measurement-weight must be in [0, 1] or -1 (automatic), got {}",
                      o.measurement_weight));
    }
    if (!(o.noise_rel >= 0 && o.noise_rel < 1) && o.noise_rel != -1) {
      bad(fmt::format("--noise-rel must be in [0, 1) or -1 (the backend's), got {}", o.noise_rel));
    }
    if (!(o.time_noise_rel >= 0 && o.time_noise_rel < 1) && o.time_noise_rel != -1) {
      bad(fmt::format("--time-noise-rel must be in [0, 1) or -1 (the backend's), got {}",
                      o.time_noise_rel));
    }
    if (o.stop_patience < 1) {
      bad(fmt::format("stop_patience must be >= 1, got {}", o.stop_patience));
    }
    if (!(o.optimism >= 0)) bad(fmt::format("optimism must be >= 0, got {}", o.optimism));
    if (o.exploration != "optimistic" && o.exploration != "spread") {
      bad(fmt::format("exploration '{}': allowed optimistic, spread", o.exploration));
    }
    if (!(o.clock_smoothing >= 0)) {
      bad(fmt::format("clock_smoothing must be >= 0, got {}", o.clock_smoothing));
    }
    if (!(o.choice_pseudo_count > 0 || o.choice_pseudo_count == -1)) {
      bad(fmt::format("choice_pseudo_count must be > 0 or -1 (empirical Bayes), got {}",
                      o.choice_pseudo_count));
    }
    if (o.smoothing_min_points < 0) {
      bad(fmt::format("smoothing_min_points must be >= 0, got {}", o.smoothing_min_points));
    }
    if (o.ensemble.members < 2) bad("the ensemble needs at least 2 members");
  }

  // The prior must have ranked the first half of the initial design (at least this many
  // points) as measured, by Spearman correlation >= kPriorAgreement on log time and on log
  // energy, before the second half follows it. Why a check at all: seeding on a prior's front
  // spends points before any evidence about the prior, and a misleading store made mbo worse
  // than cold that way (docs/search.md, "Warm starts"). Why 0.9: a rank correlation that high
  // on 14 points is not reached by chance (p < 1e-4), and below it the prior's front would
  // be a guess among near-ties anyway.
  static constexpr std::size_t kPriorCheckPoints = 8;
  static constexpr double kPriorAgreement = 0.9;

  static double spearman(const std::vector<double>& a, const std::vector<double>& b) {
    auto ranks = [](const std::vector<double>& v) {
      std::vector<std::size_t> idx(v.size());
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) { return v[x] < v[y]; });
      std::vector<double> r(v.size());
      for (std::size_t k = 0; k < idx.size(); ++k) r[idx[k]] = static_cast<double>(k);
      return r;
    };
    const auto ra = ranks(a), rb = ranks(b);
    const double n = static_cast<double>(a.size());
    double d2 = 0;
    for (std::size_t i = 0; i < a.size(); ++i) d2 += (ra[i] - rb[i]) * (ra[i] - rb[i]);
    return 1 - 6 * d2 / (n * (n * n - 1));
  }

  // The second half of the initial design when the prior agrees with the first half's
  // measurements: the configurations of the prior's predicted (time, energy) fronts, peeled
  // layer by layer (non-dominated sorting) until there are enough, each layer thinned evenly
  // along time. nullopt (keep the Latin hypercube) when it does not agree.
  static std::optional<std::vector<std::size_t>> seeded_half(const SearchSpace& space,
                                                             const Recorder& rec,
                                                             const PriorPrediction& z,
                                                             std::size_t init) {
    std::vector<double> mt, me, zt, ze;
    for (std::size_t i = 0; i < rec.order.size(); ++i) {
      mt.push_back(safe_log(rec.result.points[i].m.time_s));
      me.push_back(safe_log(rec.result.points[i].m.energy_j));
      zt.push_back(z.log_time_s[rec.order[i]]);
      ze.push_back(z.log_energy_j[rec.order[i]]);
    }
    if (spearman(mt, zt) < kPriorAgreement || spearman(me, ze) < kPriorAgreement) {
      return std::nullopt;
    }
    const std::size_t want = init - rec.order.size();
    std::vector<std::size_t> free;
    for (std::size_t i = 0; i < space.size(); ++i) {
      if (!rec.taken(i)) free.push_back(i);
    }
    std::vector<std::size_t> out;
    while (out.size() < want && !free.empty()) {
      std::vector<Point2> pts;
      pts.reserve(free.size());
      for (std::size_t i : free) pts.push_back({z.log_time_s[i], z.log_energy_j[i]});
      auto layer = pareto_front(pts);  // time ascending
      const std::size_t take = std::min(want - out.size(), layer.size());
      std::vector<bool> drop(free.size(), false);
      for (std::size_t k = 0; k < take; ++k) {
        const std::size_t j =
            take == 1 ? 0
                      : static_cast<std::size_t>(
                            std::llround(static_cast<double>(k) * (layer.size() - 1) / (take - 1)));
        out.push_back(free[layer[j]]);
      }
      for (std::size_t j : layer) drop[j] = true;
      std::vector<std::size_t> rest;
      for (std::size_t i = 0; i < free.size(); ++i) {
        if (!drop[i]) rest.push_back(free[i]);
      }
      free = std::move(rest);
    }
    return out;
  }

  static std::vector<std::size_t> initial_design(const SearchSpace& space, std::size_t k,
                                                 const SearchOptions& o) {
    const std::size_t total = space.size();
    if (initial_design_of(o) == InitialDesign::kRandom) {
      auto order = shuffled(total, o.seed);
      order.resize(k);
      return order;
    }
    // Latin hypercube over (clock, SMs, slot): each knob's range is cut into k strata and every
    // stratum is used once; collisions on the discrete grid move to a random free candidate.
    std::mt19937_64 rng(o.seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    auto perm = [&] {
      std::vector<std::size_t> p(k);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng);
      return p;
    };
    const auto pf = perm(), pm = perm(), ps = perm();
    const std::size_t nf = space.freqs_mhz.size(), nm = space.sms.size(), ns = space.slots.size();
    auto level = [&](std::size_t stratum, std::size_t levels) {
      const double x = (static_cast<double>(stratum) + u(rng)) / static_cast<double>(k);
      return std::min(levels - 1, static_cast<std::size_t>(x * static_cast<double>(levels)));
    };
    std::vector<bool> used(total, false);
    std::vector<std::size_t> out;
    const auto fallback = shuffled(total, o.seed ^ 0x5bd1e995ULL);
    std::size_t fb = 0;
    for (std::size_t i = 0; i < k; ++i) {
      std::size_t idx = (level(pf[i], nf) * nm + level(pm[i], nm)) * ns + level(ps[i], ns);
      while (used[idx]) idx = fallback[fb++ % total];
      used[idx] = true;
      out.push_back(idx);
    }
    return out;
  }

  // Relative growth of the measured hypervolume from the first `before` points to all of them,
  // both normalized on the bounds of all points: a batch that only widens the measured range
  // (slower or costlier points) adds nothing, instead of rescaling the old front.
  static double batch_gain(const SearchResult& r, std::size_t before) {
    std::vector<Point2> pts;
    pts.reserve(r.points.size());
    Point2 lo{1e300, 1e300}, hi{-1e300, -1e300};
    for (const auto& p : r.points) {
      pts.push_back({p.m.time_s, p.m.energy_j});
      lo = {std::min(lo.x, p.m.time_s), std::min(lo.y, p.m.energy_j)};
      hi = {std::max(hi.x, p.m.time_s), std::max(hi.y, p.m.energy_j)};
    }
    const double after_hv = normalized_hypervolume(pts, lo, hi);
    pts.resize(before);
    const double before_hv = normalized_hypervolume(pts, lo, hi);
    return before_hv > 0 ? after_hv / before_hv - 1.0 : 1.0;
  }
};

}  // namespace

namespace {

// Inputs shared by the cross-fitted predictions of select_front.
struct CrossFit {
  const SearchSpace& space;
  Matrix x;                       ///< features of the measured points
  std::vector<std::size_t> fold;  ///< fold of each point
  std::vector<Levels> lv;         ///< additive-model levels of each point
  std::uint64_t seed;
  double clock_smoothing;      ///< AdditiveModel's clock penalty
  double choice_pseudo_count;  ///< and its (SMs, slot) shrinkage
};

constexpr std::size_t kFolds = 5;

}  // namespace

// XGBoost's L2 leaf penalty lambda for residual trees whose target has total variance
// residual_var (in logs), noise_var of it being the measurement's repeatability. A leaf's weight
// is sum(residuals) / (n + lambda), a mean of its n residuals shrunk as if lambda residuals of 0
// were added: the empirical-Bayes (James-Stein) shrinkage of a mean of n noisy draws toward 0
// uses lambda = noise variance / signal variance (Efron & Morris, JASA 1973). Where the noise
// is most of the residual (a 1% energy draw against a model that fits to 0.3%) the trees would
// otherwise fit the draws of a few neighbouring points; where the misfit dominates (time, 0.1%
// noise against 0.5% misfit at the power cap) it is below XGBoost's default of 1, which stays.
// Residuals no larger than the noise carry no detectable signal: the largest lambda (999).
double leaf_shrinkage(double noise_var, double residual_var) {
  if (!(noise_var > 0) || !(residual_var > 0)) return 1.0;
  const double share = std::min(0.999, noise_var / residual_var);
  return std::max(1.0, share / (1.0 - share));
}

namespace {

// Cross-fitted prediction of log(v) at the held-out points of fold k: the additive model plus
// shallow, shrunk trees on what it leaves (the target is the smooth part of the response, not
// each draw). noise_rel is the objective's repeatability (leaf_shrinkage).
// offset: the prior's part of log(v) at each point (beta z; empty: none).
void fit_fold(const CrossFit& cf, std::size_t k, const std::vector<double>& v,
              const std::vector<double>& offset, std::vector<double>& out, bool monotone,
              double noise_rel) {
  std::vector<Levels> lv_tr;
  std::vector<double> ly_tr;
  Matrix tr, te;
  tr.cols = te.cols = cf.x.cols;
  std::vector<std::size_t> held;
  for (std::size_t i = 0; i < v.size(); ++i) {
    Matrix& dst = cf.fold[i] == k ? te : tr;
    dst.data.insert(dst.data.end(), cf.x.row(i), cf.x.row(i) + cf.x.cols);
    ++dst.rows;
    if (cf.fold[i] == k) {
      held.push_back(i);
    } else {
      lv_tr.push_back(cf.lv[i]);
      ly_tr.push_back(safe_log(v[i]) - (offset.empty() ? 0.0 : offset[i]));
    }
  }
  if (held.empty()) return;
  AdditiveModel am(cf.space, cf.clock_smoothing, cf.choice_pseudo_count);
  am.fit(lv_tr, ly_tr);
  std::vector<float> res;
  double ss = 0;
  for (std::size_t i = 0; i < lv_tr.size(); ++i) {
    res.push_back(static_cast<float>(ly_tr[i] - am.predict(lv_tr[i])));
    ss += res.back() * static_cast<double>(res.back());
  }
  const double sd = std::max(std::sqrt(ss / static_cast<double>(res.size())), 1e-12);
  for (auto& r : res) r = static_cast<float>(r / sd);
  XgbParams p;
  p.max_depth = 4;
  p.eta = 0.1;
  p.rounds = 60;
  p.subsample = 1.0;
  p.colsample_bytree = 1.0;
  p.min_child_weight = 2;
  p.reg_lambda = leaf_shrinkage(noise_rel * noise_rel, sd * sd);
  p.seed = cf.seed * 131 + k;
  // Log time does not increase with the clock; the additive part is not constrained, so
  // this only keeps the residual trees from adding non-monotone noise.
  if (monotone) p.monotone_constraints = monotone_in_clock(cf.x.cols);
  XgbRegressor m(p);
  m.fit(tr, res);
  const auto q = m.predict(te);
  for (std::size_t j = 0; j < held.size(); ++j) {
    const double off = offset.empty() ? 0.0 : offset[held[j]];
    out[held[j]] = std::exp(am.predict(cf.lv[held[j]]) + off + q[j] * sd);
  }
}

// The points nearest the front of the cross-fitted predictions (pt, pe): the quarter of them (at
// least 8) with the smallest normalized epsilon behind that front, in ascending predicted time.
// Why predictions only: chosen on the measurements too, the points near the front would be
// those with favourable draws, and their residuals would overstate the misfit.
std::vector<std::size_t> nearest_front(const std::vector<double>& pt,
                                       const std::vector<double>& pe) {
  const std::size_t n = pt.size();
  const Scale sx = Scale::of(pt), sy = Scale::of(pe);
  std::vector<Point2> raw(n), scaled(n);
  for (std::size_t i = 0; i < n; ++i) {
    raw[i] = {pt[i], pe[i]};
    scaled[i] = {sx(pt[i]), sy(pe[i])};
  }
  const auto front_idx = pareto_front(raw);
  std::vector<Point2> front;
  front.reserve(front_idx.size());
  for (std::size_t i : front_idx) front.push_back(scaled[i]);
  std::vector<std::pair<double, std::size_t>> behind(n);
  for (std::size_t i = 0; i < n; ++i) behind[i] = {epsilon_behind(front, scaled[i]), i};
  std::sort(behind.begin(), behind.end());
  behind.resize(std::min(n, std::max<std::size_t>(8, n / 4)));
  std::vector<std::size_t> out(behind.size());
  for (std::size_t k = 0; k < behind.size(); ++k) out[k] = behind[k].second;
  std::sort(out.begin(), out.end(), [&](std::size_t a, std::size_t b) {
    return pt[a] < pt[b] || (pt[a] == pt[b] && pe[a] < pe[b]);
  });
  return out;
}

}  // namespace

// Per-point weights of the measurement in the estimates of one objective (empirical Bayes; Efron
// & Morris, JASA 1973): the measurement m_i has variance s^2 (noise_rel^2, in logs); the
// cross-fitted prediction p_i has the variance v_i of the additive model's two effects it sums,
// plus the model's misfit tau^2. The precision-weighted mean puts w_i = (v_i + tau^2) / (v_i +
// tau^2 + s^2) on m_i. Why per point: a configuration whose (SMs, slot) choice was measured once
// is predicted from almost nothing and should keep its measurement, one measured at a dozen
// clocks is predicted better than it is measured. tau^2 is the misfit that can reorder the
// front: from the residual differences of neighbouring points along it (near_front, in order),
// tau^2 = max(0, mean ((r_k - r_{k-1})^2 - v_k - v_{k-1} - s_k^2 - s_{k-1}^2) / 2), r = log m -
// log p. s_i^2 is per point too: a screening measurement repeats worse than a full one, and the
// mean of both better (SearchPoint::noise_var_scale).
// Why differences: what the model misses in common at neighbouring points (a level, a smooth
// trend over the clocks) moves them together and does not change which dominates; a per-point
// mean square counted it, put the weights of a 56-point search at 0.4-0.65 where 0.2-0.35 ranked
// better, and cost the emulator prior 0.004 of hypervolume on the CP attention partitions.
std::vector<double> measurement_weights(const SearchOptions& o, double noise_rel,
                                        const std::vector<double>& m,
                                        const std::vector<double>& pred,
                                        const std::vector<double>& model_var,
                                        const std::vector<std::size_t>& near_front,
                                        const std::vector<double>& noise_var_scale) {
  if (o.measurement_weight >= 0) return std::vector<double>(m.size(), o.measurement_weight);
  const auto s2 = [&](std::size_t i) {
    return noise_rel * noise_rel * (noise_var_scale.empty() ? 1.0 : noise_var_scale[i]);
  };
  double d2 = 0;
  for (std::size_t k = 1; k < near_front.size(); ++k) {
    const std::size_t i = near_front[k], j = near_front[k - 1];
    const double r = (safe_log(m[i]) - safe_log(pred[i])) - (safe_log(m[j]) - safe_log(pred[j]));
    d2 += 0.5 * (r * r - model_var[i] - model_var[j] - s2(i) - s2(j));
  }
  const double pairs = static_cast<double>(std::max<std::size_t>(1, near_front.size()) - 1);
  const double tau2 = pairs > 0 ? std::max(0.0, d2 / pairs) : 0.0;
  std::vector<double> w(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    const double u = model_var[i] + tau2;
    w[i] = u + s2(i) > 0 ? u / (u + s2(i)) : 1.0;
  }
  return w;
}

namespace {

Estimates estimate_points(const std::vector<SearchPoint>& points, const SearchSpace& space,
                          const SearchOptions& o, const PriorPrediction* prior) {
  Estimates out;
  for (const auto& p : points) {
    out.ranking.push_back({p.m.time_s, p.m.energy_j});
    out.values.push_back(p.m);
  }
  if (o.selection == "measured" ||
      points.size() < static_cast<std::size_t>(std::max(16, o.smoothing_min_points)) ||
      space.sms.size() * space.slots.size() < 2) {
    return out;
  }
  CrossFit cf{space,
              {},
              std::vector<std::size_t>(points.size()),
              {},
              o.seed,
              o.clock_smoothing,
              o.choice_pseudo_count};
  cf.x.rows = points.size();
  cf.x.cols = feature_count(space);
  cf.x.data.assign(cf.x.rows * cf.x.cols, 0.0f);
  for (std::size_t i = 0; i < points.size(); ++i) {
    config_features(space, points[i].config, cf.x.data.data() + i * cf.x.cols);
  }
  // Seeded fold assignment: point i is predicted by trees that never saw it.
  const auto order = shuffled(points.size(), o.seed ^ 0x9e3779b97f4a7c15ULL);
  for (std::size_t r = 0; r < order.size(); ++r) cf.fold[order[r]] = r % kFolds;
  std::vector<double> t, e;
  for (const auto& p : points) {
    t.push_back(p.m.time_s);
    e.push_back(p.m.energy_j);
  }
  cf.lv.reserve(points.size());
  for (const auto& p : points) cf.lv.push_back(levels_of(space, p.config));
  // The model's inputs repeat at the points' mean variance (screening, confirmed and full
  // measurements mixed).
  std::vector<double> scale;
  double mean_scale = 0;
  for (const auto& p : points) {
    scale.push_back(std::max(0.0, p.noise_var_scale));
    mean_scale += scale.back() / static_cast<double>(points.size());
  }
  const NoiseRel noise = noise_rel_of(o);
  const double model_sd = std::sqrt(mean_scale);
  std::vector<double> off_t, off_e;
  if (prior && !prior->empty()) {
    std::vector<std::size_t> idx;
    std::vector<double> zt, ze, lt, le;
    for (std::size_t i = 0; i < points.size(); ++i) {
      idx.push_back(index_of(space, cf.lv[i]));
      zt.push_back(prior->log_time_s[idx.back()]);
      ze.push_back(prior->log_energy_j[idx.back()]);
      lt.push_back(safe_log(t[i]));
      le.push_back(safe_log(e[i]));
    }
    out.beta_time =
        choose_prior_weight(space, idx, lt, zt, o.clock_smoothing, o.seed, o.choice_pseudo_count);
    out.beta_energy = choose_prior_weight(space, idx, le, ze, o.clock_smoothing, o.seed + 1,
                                          o.choice_pseudo_count);
    for (std::size_t i = 0; i < points.size(); ++i) {
      off_t.push_back(out.beta_time * zt[i]);
      off_e.push_back(out.beta_energy * ze[i]);
    }
  }
  std::vector<double> pt(points.size()), pe(points.size());
  for (std::size_t k = 0; k < kFolds; ++k) {
    fit_fold(cf, k, t, off_t, pt, true, noise.time * model_sd);
    fit_fold(cf, k, e, off_e, pe, false, noise.energy * model_sd);
  }
  // Variance of each prediction's additive part, in units of the objective's noise variance
  // (a time repeats about ten times better than an energy): the (SMs, slot) effect's is one over
  // the other points of its choice; the clock effect's is the smoother's, which pools the
  // neighbouring clocks (a free per-clock mean's 1 / (n - 1) overstated it several times at 56
  // points over 18 clocks), scaled up by the folds' share of the points.
  std::vector<int> n_combo(space.sms.size() * space.slots.size()), n_clock(space.freqs_mhz.size());
  for (const auto& l : cf.lv) {
    ++n_combo[l.combo];
    ++n_clock[l.freq];
  }
  std::vector<double> clock_share(space.freqs_mhz.size());
  if (o.clock_smoothing > 0) {
    const std::vector<double> fx(space.freqs_mhz.begin(), space.freqs_mhz.end());
    whittaker_smooth(fx, n_clock, std::vector<double>(fx.size()), o.clock_smoothing, nullptr,
                     &clock_share);
    for (auto& v : clock_share) v *= static_cast<double>(kFolds) / (kFolds - 1);
  } else {
    for (std::size_t f = 0; f < clock_share.size(); ++f)
      clock_share[f] = 1.0 / std::max(1, n_clock[f] - 1);
  }
  std::vector<double> var_t(points.size()), var_e(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double share =
        1.0 / std::max(1, n_combo[cf.lv[i].combo] - 1) + clock_share[cf.lv[i].freq];
    var_t[i] = noise.time * noise.time * share * mean_scale;
    var_e[i] = noise.energy * noise.energy * share * mean_scale;
  }
  const auto near_front = nearest_front(pt, pe);
  const auto wt = measurement_weights(o, noise.time, t, pt, var_t, near_front, scale);
  const auto we = measurement_weights(o, noise.energy, e, pe, var_e, near_front, scale);
  for (std::size_t i = 0; i < points.size(); ++i) {
    out.ranking[i] = {wt[i] * t[i] + (1 - wt[i]) * pt[i], we[i] * e[i] + (1 - we[i]) * pe[i]};
  }
  // The values: each clock's predictions recentred on the mean log residual of all its points.
  // The smoothed clock effect serves the ranking (adjacent clocks share their points, so which
  // clock ends the front is not decided by a draw), but it rounds the kinks of the response to
  // the clock (the power cap, the voltage floor): on the per-clock fronts of 4 paper workloads
  // it put values up to 1.3% below the truth. The recentring is unbiased, and its noise is
  // common to the points of a clock, so it does not reorder them.
  const std::size_t nf = space.freqs_mhz.size();
  std::vector<double> shift_t(nf), shift_e(nf);
  for (std::size_t i = 0; i < points.size(); ++i) {
    shift_t[cf.lv[i].freq] += std::log(t[i] / pt[i]) / n_clock[cf.lv[i].freq];
    shift_e[cf.lv[i].freq] += std::log(e[i] / pe[i]) / n_clock[cf.lv[i].freq];
  }
  for (std::size_t i = 0; i < points.size(); ++i) {
    const std::size_t f = cf.lv[i].freq;
    // The measurement's static power splits the estimated energy (the static part is the
    // backend's static power times the time).
    const double static_w = t[i] > 0 ? points[i].m.static_energy_j / t[i] : 0.0;
    out.values[i] =
        make_measurement(wt[i] * t[i] + (1 - wt[i]) * pt[i] * std::exp(shift_t[f]),
                         we[i] * e[i] + (1 - we[i]) * pe[i] * std::exp(shift_e[f]), static_w);
  }
  return out;
}

}  // namespace

std::vector<std::size_t> select_front(const std::vector<SearchPoint>& points,
                                      const SearchSpace& space, const SearchOptions& o,
                                      const PriorPrediction* prior) {
  return pareto_front(estimate_points(points, space, o, prior).ranking);
}

std::vector<Measurement> smoothed_estimates(const std::vector<SearchPoint>& points,
                                            const SearchSpace& space, const SearchOptions& o,
                                            const PriorPrediction* prior) {
  return estimate_points(points, space, o, prior).values;
}

// Why the additive model: it carries an (SMs, slot) choice's merit from the clocks where it was
// measured to the clock asked about, which is what a search that spread its points over every
// clock knows about one clock. A choice never measured predicts the average, so it joins only
// when the front at that clock is thin.
std::vector<PartitionConfig> predicted_clock_front(const std::vector<SearchPoint>& points,
                                                   const SearchSpace& space, const SearchOptions& o,
                                                   int freq_mhz, std::size_t max_points) {
  const auto fpos =
      static_cast<std::size_t>(std::find(space.freqs_mhz.begin(), space.freqs_mhz.end(), freq_mhz) -
                               space.freqs_mhz.begin());
  if (fpos == space.freqs_mhz.size() || max_points == 0 || points.empty()) return {};
  std::vector<Levels> lv;
  std::vector<double> log_t, log_e;
  std::set<std::size_t> measured;
  for (const SearchPoint& pt : points) {
    const Levels l = levels_of(space, pt.config);
    if (l.freq >= space.freqs_mhz.size()) continue;  // a point outside this space
    lv.push_back(l);
    log_t.push_back(safe_log(pt.m.time_s));
    log_e.push_back(safe_log(pt.m.dynamic_energy_j));
    measured.insert(index_of(space, l));
  }
  if (lv.empty()) return {};
  AdditiveModel mt(space, o.clock_smoothing, o.choice_pseudo_count),
      me(space, o.clock_smoothing, o.choice_pseudo_count);
  mt.fit(lv, log_t);
  me.fit(lv, log_e);
  const std::size_t combos = space.sms.size() * space.slots.size();
  std::vector<Point2> pred(combos);
  for (std::size_t c = 0; c < combos; ++c) {
    const Levels l{fpos, c};
    pred[c] = {mt.predict(l), me.predict(l)};
  }
  // Peel predicted fronts (measured choices included: one of them may already cover a spot)
  // and take the unmeasured members, the front nearest first.
  std::vector<PartitionConfig> out;
  std::vector<std::size_t> left(combos);
  std::iota(left.begin(), left.end(), std::size_t{0});
  while (!left.empty() && out.size() < max_points) {
    std::vector<Point2> pts;
    pts.reserve(left.size());
    for (std::size_t c : left) pts.push_back(pred[c]);
    const std::vector<std::size_t> front = pareto_front(pts);
    std::vector<std::size_t> layer;
    layer.reserve(front.size());
    for (std::size_t k : front) layer.push_back(left[k]);
    std::vector<std::size_t> fresh;
    for (std::size_t c : layer) {
      if (!measured.count(index_of(space, {fpos, c}))) fresh.push_back(c);
    }
    // More new members than room: evenly spaced along the layer (time ascending), ends first.
    const std::size_t room = max_points - out.size();
    for (std::size_t j = 0; j < std::min(room, fresh.size()); ++j) {
      const std::size_t k =
          room >= fresh.size() || room == 1
              ? j
              : static_cast<std::size_t>(
                    std::lround(static_cast<double>(j) * static_cast<double>(fresh.size() - 1) /
                                static_cast<double>(room - 1)));
      out.push_back(space.at(index_of(space, {fpos, fresh[k]})));
    }
    std::set<std::size_t> drop(layer.begin(), layer.end());
    std::erase_if(left, [&](std::size_t c) { return drop.count(c) > 0; });
  }
  return out;
}

namespace {

// Name registry of search strategies, as the profilers' (src/backends/registry.cc): the error
// for an unknown name lists every registered one.
std::map<std::string, SearchStrategyFactory>& strategy_registry() {
  static std::map<std::string, SearchStrategyFactory> r = {
      {"exhaustive", [] { return std::make_unique<ExhaustiveSearch>(); }},
      {"mbo", [] { return std::make_unique<MboSearch>(); }},
      {"random", [] { return std::make_unique<RandomSearch>(); }},
  };
  return r;
}

std::mutex& strategy_registry_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

bool register_search_strategy(const std::string& name, SearchStrategyFactory factory) {
  std::lock_guard<std::mutex> lock(strategy_registry_mutex());
  strategy_registry()[name] = std::move(factory);
  return true;
}

std::vector<std::string> search_strategy_names() {
  std::lock_guard<std::mutex> lock(strategy_registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, f] : strategy_registry()) names.push_back(name);
  return names;
}

std::unique_ptr<SearchStrategy> create_search_strategy(const std::string& name) {
  SearchStrategyFactory f;
  {
    std::lock_guard<std::mutex> lock(strategy_registry_mutex());
    auto it = strategy_registry().find(name);
    if (it != strategy_registry().end()) f = it->second;
  }
  if (!f) {
    throw InvalidInput(fmt::format("unknown search strategy '{}'; available: {}", name,
                                   fmt::join(search_strategy_names(), ", ")));
  }
  return f();
}

}  // namespace kareus
