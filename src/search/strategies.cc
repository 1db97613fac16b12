// Search strategies.
//
// `mbo` is the multi-pass multi-objective Bayesian optimization of Kareus (Wu, Chung, Chowdhury,
// OSDI '26, section 5): gradient-boosted-tree surrogates for time and dynamic energy, a
// bootstrap ensemble for uncertainty, random initial points, then batches filled by several
// passes over the unevaluated candidates, each with its own criterion: hypervolume improvement
// (HVI) of the predicted mean on (time, total energy) and on (time, dynamic energy), lowest
// predicted time, highest uncertainty. Objectives are min-max normalized on the measured points
// and the reference point is 1.1 x the worst observed value. Beyond the artifact: within a pass
// the HVI picks are greedy with the picked predictions added to the front ("Kriging believer",
// Ginsbourger et al. 2010), so one batch does not spend many points on one spot; an optional
// Latin-hypercube initial design (McKay, Beckman, Conover, Technometrics 1979); an optional
// stopping rule on measured hypervolume growth.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "kareus/error.h"
#include "kareus/search.h"

namespace kareus {

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
    for (std::size_t i : idx) pts.push_back({points[i].m.time_s, points[i].m.dynamic_energy_j});
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

// One batch of mbo: surrogates fitted on the measured points predict every unevaluated
// candidate; then the passes (HVI on total and on dynamic energy, fastest, uncertain) pick.
class BatchSelector {
 public:
  BatchSelector(const Matrix& all, const Recorder& rec, const SearchOptions& o, double p_static,
                std::uint64_t seed)
      : pts_(rec.result.points) {
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
    fit_and_predict(all, rec, o, p_static, seed);
    chosen_.assign(cand_.size(), false);
  }

  std::vector<std::size_t> select(std::size_t b, const SearchOptions& o) {
    const std::size_t k1 = static_cast<std::size_t>(std::llround(b * o.share_hvi_total));
    const std::size_t k2 = std::min(
        b - std::min(b, k1), static_cast<std::size_t>(std::llround(b * o.share_hvi_dynamic)));
    const std::size_t k3 = std::min(b - std::min(b, k1 + k2),
                                    static_cast<std::size_t>(std::llround(b * o.share_fastest)));
    const std::size_t k4 = b - std::min(b, k1 + k2 + k3);
    hvi_pass(k1, pe_, es_, e_);
    hvi_pass(k2, pd_, ds_, d_);
    rank_pass(k3, [&](std::size_t j) { return pt_[j]; });
    uncertainty_pass(k4);
    // Rounding or an exhausted pass can leave the batch short: fill by total-energy HVI.
    if (batch_.size() < b) hvi_pass(b - batch_.size(), pe_, es_, e_);
    return batch_;
  }

 private:
  // Targets min-max normalized for training (trees are scale-free, squared error is not);
  // predictions back in physical units.
  void fit_and_predict(const Matrix& all, const Recorder& rec, const SearchOptions& o,
                       double p_static, std::uint64_t seed) {
    Matrix x;
    x.rows = pts_.size();
    x.cols = all.cols;
    std::vector<float> yt, yd;
    for (std::size_t i = 0; i < pts_.size(); ++i) {
      const float* r = all.row(rec.order[i]);
      x.data.insert(x.data.end(), r, r + all.cols);
      yt.push_back(static_cast<float>(ts_(t_[i])));
      yd.push_back(static_cast<float>(ds_(d_[i])));
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
    for (std::size_t j = 0; j < cand_.size(); ++j) {
      pt_[j] = ts_.lo + mt[j] * ts_.scale;
      pd_[j] = ds_.lo + md[j] * ds_.scale;
      pe_[j] = pd_[j] + p_static * pt_[j];
    }
  }

  void choose(std::size_t j) {
    chosen_[j] = true;
    batch_.push_back(cand_[j]);
  }

  // Greedy hypervolume improvement on (time, y): each pick joins the front as if measured
  // ("Kriging believer"), so the next pick goes elsewhere.
  void hvi_pass(std::size_t k, const std::vector<double>& py, const Scale& ys,
                const std::vector<double>& measured_y) {
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
        const Point2 q{ts_(pt_[j]), ys(py[j])};
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
      front.add({ts_(pt_[best]), ys(py[best])});
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
  std::vector<double> t_, d_, e_;     ///< measured time, dynamic and total energy
  Scale ts_, ds_, es_;                ///< their normalizations
  std::vector<std::size_t> cand_;     ///< unevaluated candidate indices
  std::vector<double> pt_, pd_, pe_;  ///< predicted time, dynamic and total energy
  std::vector<double> st_, sd_;       ///< predicted spreads (normalized)
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
                   const SearchOptions& o, const SearchProgress& progress) override {
    validate(o);
    const std::size_t total = space.size();
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(o.budget), total);
    Recorder rec(part, space, prof, static_cast<int>(n), progress);
    rec.result.strategy = name();
    const double p_static = prof.backend().static_power_w();

    // Features of every candidate: clock, SMs, slot one-hot.
    Matrix all;
    all.rows = total;
    all.cols = 2 + space.slots.size();
    all.data.assign(all.rows * all.cols, 0.0f);
    for (std::size_t i = 0; i < total; ++i) {
      const auto c = space.at(i);
      float* row = all.data.data() + i * all.cols;
      row[0] = static_cast<float>(c.freq_mhz);
      row[1] = static_cast<float>(c.sms);
      const auto slot = std::find(space.slots.begin(), space.slots.end(), c.slot);
      row[2 + static_cast<std::size_t>(slot - space.slots.begin())] = 1.0f;
    }

    // Initial design. Below the reference budget (224) it shrinks in proportion.
    const double scale = std::min(1.0, static_cast<double>(o.budget) / 224.0);
    std::size_t init = static_cast<std::size_t>(std::llround(o.initial_points * scale));
    init = std::clamp<std::size_t>(init, std::min<std::size_t>(n, 8), n);
    rec.measure_batch(initial_design(space, init, o));

    // Batches shrink with the budget as well, keeping the artifact's four refits: a small budget
    // gains more from refitting often than from large batches chosen by a weak model.
    const std::size_t batch_size =
        std::max<std::size_t>(std::min<std::size_t>(8, static_cast<std::size_t>(o.batch_size)),
                              static_cast<std::size_t>(std::llround(o.batch_size * scale)));
    std::uint64_t batch_seed = o.seed;
    while (rec.result.points.size() < n) {
      const std::size_t b = std::min<std::size_t>(batch_size, n - rec.result.points.size());
      const double hv_before = measured_hv(rec.result);
      const auto t0 = std::chrono::steady_clock::now();
      const auto batch = select_batch(all, rec, b, o, p_static, ++batch_seed);
      rec.result.surrogate_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rec.measure_batch(batch);
      ++rec.result.batches;
      if (o.stop_threshold > 0 && hv_before > 0) {
        const double gain = measured_hv(rec.result) / hv_before - 1.0;
        if (gain < o.stop_threshold) {
          rec.result.stopped_early = rec.result.points.size() < n;
          break;
        }
      }
    }
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
    if (o.ensemble.members < 2) bad("the ensemble needs at least 2 members");
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

  static double measured_hv(const SearchResult& r) {
    std::vector<Point2> pts;
    Point2 lo{1e300, 1e300}, hi{-1e300, -1e300};
    for (const auto& p : r.points) {
      pts.push_back({p.m.time_s, p.m.energy_j});
      lo = {std::min(lo.x, p.m.time_s), std::min(lo.y, p.m.energy_j)};
      hi = {std::max(hi.x, p.m.time_s), std::max(hi.y, p.m.energy_j)};
    }
    return normalized_hypervolume(pts, lo, hi);
  }

  // One batch: the four passes over the unevaluated candidates (BatchSelector).
  static std::vector<std::size_t> select_batch(const Matrix& all, const Recorder& rec,
                                               std::size_t b, const SearchOptions& o,
                                               double p_static, std::uint64_t seed) {
    BatchSelector sel(all, rec, o, p_static, seed);
    return sel.select(b, o);
  }
};

}  // namespace

namespace {

// Name registry of search strategies, as the profilers' (src/profiler/registry.cc): the error
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
