#include "kareus/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "search/selection.h"
#include "test_util.h"

namespace kareus {
namespace {

// Emulator options by field (ProfilerOptions grows; aggregate initialisation would not).
struct Fixture {
  Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  PartitionSet ps = partition_workload(w);
  EmulatorProfiler prof{test::emulator_options(w.gpu_name, 0.01, 1)};
  CachedProfiler cp{prof, nullptr};
};

std::vector<std::tuple<int, int, std::string>> configs(const SearchResult& r) {
  std::vector<std::tuple<int, int, std::string>> out;
  for (const auto& p : r.points) out.emplace_back(p.config.freq_mhz, p.config.sms, p.config.slot);
  return out;
}

TEST(SearchSpace, ArtifactDefaults) {
  Fixture f;
  const auto s = make_search_space(f.ps.partition("fwd_attn"), f.w.gpu());
  EXPECT_EQ(s.size(), 18u * 10 * 4);
  EXPECT_EQ(s.sms.front(), 3);
  EXPECT_EQ(s.sms.back(), 30);
  const auto cp =
      partition_workload(load_workload(test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096")));
  const auto ag = make_search_space(cp.partition("fwd_ao_ag"), f.w.gpu());
  // 1..20 and NCCL's default on the A100 (24 CTAs), the Nanobatching baseline's setting.
  EXPECT_EQ(ag.sms.size(), 21u);
  EXPECT_EQ(ag.sms.front(), 1);
  EXPECT_EQ(ag.sms.back(), 24);
  // H100: NCCL's 32 CTAs join both grids, in ascending order.
  const GpuSpec& h100 = gpu_by_name("h100-sxm");
  const auto ar_h = make_search_space(f.ps.partition("fwd_attn"), h100);
  EXPECT_EQ(ar_h.sms.size(), 11u);
  EXPECT_EQ(ar_h.sms.back(), 32);
  EXPECT_EQ(make_search_space(cp.partition("fwd_ao_ag"), h100).sms.back(), 32);
  // An explicit list is taken as given.
  EXPECT_EQ(make_search_space(f.ps.partition("fwd_attn"), h100, {{}, {4, 8}}).sms,
            (std::vector<int>{4, 8}));
  std::set<std::tuple<int, int, std::string>> uniq;
  for (const auto& c : s.configs()) uniq.insert({c.freq_mhz, c.sms, c.slot});
  EXPECT_EQ(uniq.size(), s.size());
  EXPECT_THROW(make_search_space(f.ps.partition("fwd_attn"), f.w.gpu(), {{1405}, {}}),
               InvalidInput);
  EXPECT_THROW(make_search_space(f.ps.partition("fwd_attn"), f.w.gpu(), {{}, {0}}), InvalidInput);
}

TEST(Search, SameSeedSameResult) {
  Fixture f;
  const auto& p = f.ps.partition("bwd_attn");
  const auto space = make_search_space(p, f.w.gpu());
  SearchOptions o;
  o.budget = 112;
  for (const char* name : {"mbo", "random"}) {
    auto s = create_search_strategy(name);
    o.seed = 5;
    const auto a = s->run(p, space, f.cp, o, {});
    const auto b = s->run(p, space, f.cp, o, {});
    o.seed = 6;
    const auto c = s->run(p, space, f.cp, o, {});
    EXPECT_EQ(configs(a), configs(b)) << name;
    EXPECT_NE(configs(a), configs(c)) << name;
    EXPECT_EQ(a.evaluations, 112) << name;
    std::set<std::tuple<int, int, std::string>> uniq;
    for (const auto& t : configs(a)) uniq.insert(t);
    EXPECT_EQ(uniq.size(), 112u) << name << ": duplicates measured";
  }
}

TEST(Search, BudgetBeyondSpaceMeasuresItAll) {
  Fixture f;
  const auto& p = f.ps.partition("fwd_mlp");
  const auto space = make_search_space(p, f.w.gpu());
  SearchOptions o;
  o.budget = 100000;
  for (const char* name : {"mbo", "random", "exhaustive"}) {
    EXPECT_EQ(create_search_strategy(name)->run(p, space, f.cp, o, {}).evaluations, 540) << name;
  }
}

// Truth-scored hypervolume (as bench/search_efficiency): the configurations `idx` of a search
// evaluated by the noise-free emulator, over the true exhaustive front's hypervolume.
class TruthScore {
 public:
  TruthScore(const Partition& p, const SearchSpace& space, const std::string& gpu)
      : p_(p), oracle_(test::emulator_options(gpu, 0.0, 1)) {
    std::vector<Point2> all;
    for (const auto& c : space.configs()) {
      const auto m = oracle_.measure(p, c);
      all.push_back({m.time_s, m.energy_j});
      lo_ = {std::min(lo_.x, m.time_s), std::min(lo_.y, m.energy_j)};
      hi_ = {std::max(hi_.x, m.time_s), std::max(hi_.y, m.energy_j)};
    }
    full_ = normalized_hypervolume(all, lo_, hi_);
  }
  double operator()(const SearchResult& r, const std::vector<std::size_t>& idx) {
    std::vector<Point2> q;
    for (std::size_t i : idx) {
      const auto m = oracle_.measure(p_, r.points[i].config);
      q.push_back({m.time_s, m.energy_j});
    }
    return normalized_hypervolume(q, lo_, hi_) / full_;
  }

 private:
  const Partition& p_;
  EmulatorProfiler oracle_;
  Point2 lo_{1e300, 1e300}, hi_{0, 0};
  double full_ = 1;
};

// Scored by truth (issue 13): the configurations a search recommends, evaluated without noise,
// against the noise-free exhaustive front. On Llama's bwd_mlp the front is one (SMs, slot)
// choice at every clock, about 1% better than its neighbours, so 1% noise lets lucky draws
// displace it; the artifact's MBO (tree surrogates, measured front) lost to random search here.
TEST(Search, MboBeatsRandomByTruthOnAnMlpPartition) {
  Fixture f;
  const auto& p = f.ps.partition("bwd_mlp");
  const auto space = make_search_space(p, f.w.gpu());
  TruthScore truth(p, space, f.w.gpu_name);
  double mbo = 0, mbo_measured_front = 0, rnd = 0;
  for (std::uint64_t s = 1; s <= 3; ++s) {
    EmulatorProfiler noisy{test::emulator_options(f.w.gpu_name, 0.01, s)};
    CachedProfiler cp{noisy, nullptr};
    SearchOptions o;
    o.seed = s;
    const auto m = create_search_strategy("mbo")->run(p, space, cp, o, {});
    const auto r = create_search_strategy("random")->run(p, space, cp, o, {});
    EXPECT_EQ(r.selected, r.front());
    mbo += truth(m, m.selected) / 3;
    mbo_measured_front += truth(m, m.front()) / 3;
    rnd += truth(r, r.selected) / 3;
  }
  // On the fitted model: mbo 0.99995, random 0.9973 (3 seeds); the capped top clocks make this
  // front easy for random search (0.9930 before the artifact's terms, 0.9768 before the cap).
  EXPECT_GT(mbo, rnd + 0.002);
  EXPECT_GT(mbo, 0.995);
  EXPECT_GT(mbo, mbo_measured_front);  // the smoothed selection is what beats the noise
  EXPECT_LE(mbo, 1.0 + 1e-12);
}

// On Qwen3 1.7B CP fwd_qkv_ar the true front is 21 SMs at the `linear` slot at every clock,
// 4.5% faster than 18 or 24 SMs: a narrow valley the surrogate cannot predict from its
// neighbours. With 1% noise on time as well as energy (ten times an H200's time noise), the
// spread-based exploration of the 28 + 28 schedule never measured it in 224 points at noise seed 1
// (0.9753 of the true hypervolume); the optimistic pass tries the (SMs, slot) choices whose effect
// is uncertain, and finds it. With refits every 7 points both find it (5 seeds at 224: optimistic
// 0.9982, worst 0.9956; spread 0.9971, worst 0.9912), so the test asks that the optimistic pass
// measures the valley and ends near the truth, not that it beats the spread pass.
TEST(Search, OptimisticExplorationFindsANarrowValley) {
  const Workload w = load_workload(test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096"));
  const PartitionSet ps = partition_workload(w);
  const auto& p = ps.partition("fwd_qkv_ar");
  const auto space = make_search_space(p, w.gpu());
  TruthScore truth(p, space, w.gpu_name);
  auto run = [&](const std::string& exploration) {
    auto po = test::emulator_options(w.gpu_name, 0.01, 1);
    po.time_noise = 0.01;
    EmulatorProfiler noisy{po};
    CachedProfiler cp{noisy, nullptr};
    SearchOptions o;
    o.seed = 1;
    o.exploration = exploration;
    return create_search_strategy("mbo")->run(p, space, cp, o, {});
  };
  auto valley_points = [](const SearchResult& r) {
    return std::count_if(r.points.begin(), r.points.end(), [](const SearchPoint& x) {
      return x.config.sms == 21 && x.config.slot == "linear";
    });
  };
  const auto optimistic = run("optimistic");
  EXPECT_GT(valley_points(optimistic), 0);
  EXPECT_GT(truth(optimistic, optimistic.selected), 0.995);
}

// mbo's schedule does not depend on the budget: a smaller budget on a batch boundary measures
// the first points of a larger one, so a benchmark can score budgets as prefixes of one run.
TEST(Search, MboSmallerBudgetIsAPrefix) {
  Fixture f;
  const auto& p = f.ps.partition("fwd_attn");
  const auto space = make_search_space(p, f.w.gpu());
  SearchOptions o;
  o.seed = 9;
  o.budget = 140;
  const auto big = create_search_strategy("mbo")->run(p, space, f.cp, o, {});
  o.budget = 84;  // 21 + 9 x 7
  const auto small = create_search_strategy("mbo")->run(p, space, f.cp, o, {});
  ASSERT_EQ(small.points.size(), 84u);
  auto prefix = configs(big);
  prefix.resize(84);
  EXPECT_EQ(configs(small), prefix);
  EXPECT_EQ(small.batches, 9);
  EXPECT_EQ(big.batches, 17);  // 21 + 17 x 7
}

TEST(Search, SelectFrontOptions) {
  Fixture f;
  const auto& p = f.ps.partition("fwd_mlp");
  const auto space = make_search_space(p, f.w.gpu());
  SearchOptions o;
  o.budget = 112;
  const auto r = create_search_strategy("mbo")->run(p, space, f.cp, o, {});
  // Weight 1 on the measurement, or "measured": exactly the measured Pareto set.
  o.measurement_weight = 1.0;
  EXPECT_EQ(select_front(r.points, space, o), r.front());
  // The automatic weight with noise-free measurements: every weight is 1, the measured set.
  o.measurement_weight = -1;
  o.noise_rel = 0;
  EXPECT_EQ(select_front(r.points, space, o), r.front());
  o.noise_rel = 0.01;
  o.measurement_weight = 0.5;
  o.selection = "measured";
  EXPECT_EQ(select_front(r.points, space, o), r.front());
  // The smoothed set is a Pareto set of estimates: never empty, no index twice, time order of
  // the estimates is not required to match the measurements', but it is a subset of the points.
  o.selection = "smoothed";
  o.measurement_weight = -1;
  const auto sel = select_front(r.points, space, o);
  EXPECT_EQ(sel, r.selected);  // the run's own recommendation, deterministic
  ASSERT_FALSE(sel.empty());
  EXPECT_EQ(std::set<std::size_t>(sel.begin(), sel.end()).size(), sel.size());
  for (std::size_t i : sel) EXPECT_LT(i, r.points.size());
  // Fewer than smoothing_min_points (28 by default): the measured set.
  ASSERT_EQ(o.smoothing_min_points, 28);
  const std::vector<SearchPoint> few(r.points.begin(), r.points.begin() + 27);
  std::vector<Point2> few_m;
  few_m.reserve(few.size());
  for (const auto& x : few) few_m.push_back({x.m.time_s, x.m.energy_j});
  EXPECT_EQ(select_front(few, space, o), pareto_front(few_m));
  const std::vector<std::function<void(SearchOptions&)>> bad = {
      [](SearchOptions& b) { b.selection = "best"; },
      [](SearchOptions& b) { b.measurement_weight = 1.5; },
      [](SearchOptions& b) { b.noise_rel = -0.1; },
      [](SearchOptions& b) { b.time_noise_rel = 1.0; },
      [](SearchOptions& b) { b.surrogate = "gp"; },
      [](SearchOptions& b) { b.smoothing_min_points = -1; },
      [](SearchOptions& b) { b.exploration = "greedy"; },
      [](SearchOptions& b) { b.optimism = -1; },
      [](SearchOptions& b) { b.clock_smoothing = -1; },
      [](SearchOptions& b) { b.choice_pseudo_count = 0; },
      [](SearchOptions& b) { b.choice_pseudo_count = -0.5; }};
  for (const auto& make_bad : bad) {
    SearchOptions b;
    make_bad(b);
    EXPECT_THROW(create_search_strategy("mbo")->run(p, space, f.cp, b, {}), InvalidInput);
  }
}

// The automatic weight against hand-computed empirical-Bayes numbers (noise 1%, s^2 = 1e-4).
TEST(Search, MeasurementWeightsAreThePrecisionShares) {
  SearchOptions o;
  ASSERT_EQ(o.measurement_weight, -1);  // automatic by default
  const std::vector<double> m = {1.0, 1.0, 1.0, 1.0};
  // Log residuals r = log m - log pred of -0.02, 0.02, 0 on the near-front points, in their order
  // along the front; the fourth point is far behind the front and its misfit of 0.5 must not
  // count.
  const std::vector<double> pred = {std::exp(0.02), std::exp(-0.02), 1.0, std::exp(0.5)};
  const std::vector<double> v = {1e-4, 1e-4, 2e-4, 1e-4};
  // Neighbours' halved squared differences less their mean v: (0.04^2 - 2e-4) / 2 = 7e-4 and
  // (0.02^2 - 3e-4) / 2 = 0.5e-4; tau^2 = (7e-4 + 0.5e-4) / 2 - 1e-4 = 2.75e-4, so w = (v +
  // tau^2) / (v + tau^2 + s^2): 15/19 for v = 1e-4 and 19/23 for v = 2e-4.
  auto w = measurement_weights(o, 0.01, m, pred, v, {0, 1, 2});
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0], 15.0 / 19, 1e-12);
  EXPECT_NEAR(w[1], 15.0 / 19, 1e-12);
  EXPECT_NEAR(w[2], 19.0 / 23, 1e-12);
  EXPECT_NEAR(w[3], 15.0 / 19, 1e-12);
  // A model that fits to within the noise: tau^2 = 0, w = v / (v + s^2).
  w = measurement_weights(o, 0.01, m, m, v, {0, 1, 2, 3});
  EXPECT_NEAR(w[0], 0.5, 1e-12);
  EXPECT_NEAR(w[2], 2.0 / 3, 1e-12);
  // A misfit common to the near-front points (every prediction 3% low) moves them together and
  // cannot reorder them: no tau^2 either, where a mean square of residuals would count 9e-4.
  const std::vector<double> low = {std::exp(-0.03), std::exp(-0.03), std::exp(-0.03), 1.0};
  w = measurement_weights(o, 0.01, m, low, v, {0, 1, 2});
  EXPECT_NEAR(w[0], 0.5, 1e-12);
  EXPECT_NEAR(w[2], 2.0 / 3, 1e-12);
  // Per-point repeatability (a screening point at 2.25 s^2, a confirmed one at 0.5 s^2): each
  // pair's noise is its own, (0.04^2 - 2e-4 - 3.25e-4) / 2 = 5.375e-4 and (0.02^2 - 3e-4 -
  // 1.5e-4) / 2 = -0.25e-4, so tau^2 = 2.5625e-4, and each weight uses its own s_i^2.
  w = measurement_weights(o, 0.01, m, pred, v, {0, 1, 2}, {2.25, 1, 0.5, 1});
  EXPECT_NEAR(w[0], 3.5625 / 5.8125, 1e-12);
  EXPECT_NEAR(w[1], 3.5625 / 4.5625, 1e-12);
  EXPECT_NEAR(w[2], 4.5625 / 5.0625, 1e-12);
  EXPECT_NEAR(w[3], 3.5625 / 4.5625, 1e-12);
  // Noise-free measurements are taken as they are; a fixed weight is used as given.
  w = measurement_weights(o, 0.0, m, pred, {0, 0, 0, 0}, {0, 1, 2});
  for (double x : w) EXPECT_EQ(x, 1.0);
  o.measurement_weight = 0.25;
  w = measurement_weights(o, 0.01, m, pred, v, {0, 1, 2});
  for (double x : w) EXPECT_EQ(x, 0.25);
}

// The selection trees' leaf penalty against hand-computed noise-to-signal ratios.
TEST(Search, LeafShrinkageIsTheNoiseToSignalRatio) {
  // 1% energy noise in residuals of 1.118% (variance 1.25e-4): signal variance 0.25e-4, lambda
  // 1e-4 / 0.25e-4 = 4 pseudo-points of 0 in every leaf.
  EXPECT_NEAR(leaf_shrinkage(1e-4, 1.25e-4), 4.0, 1e-9);
  EXPECT_NEAR(leaf_shrinkage(1e-4, 1.1e-4), 10.0, 1e-9);
  // 0.1% time noise in 0.5% residuals: 1e-6 / 2.4e-5 = 0.042, below XGBoost's default of 1.
  EXPECT_EQ(leaf_shrinkage(1e-6, 2.5e-5), 1.0);
  // Residuals within the noise: the largest penalty, 0.999 / 0.001.
  EXPECT_NEAR(leaf_shrinkage(1e-4, 0.9e-4), 999.0, 1e-6);
  EXPECT_NEAR(leaf_shrinkage(1e-4, 1e-4), 999.0, 1e-6);
  // Exact measurements or an exact fit: XGBoost's default.
  EXPECT_EQ(leaf_shrinkage(0.0, 1e-4), 1.0);
  EXPECT_EQ(leaf_shrinkage(1e-4, 0.0), 1.0);
}

// An exactly additive response, log y = a[clock] + b[choice], where one choice (3 SMs: +40%, a
// collective left exposed) is measured at one clock only. With one pseudo-point its effect is
// half absorbed, and backfitting hands the other half to that clock's effect: the two choices
// measured at every clock are then predicted 0.4 / 2 / 3 = 6.7% high there. The empirical-Bayes
// pseudo-count (residual over effect variance, here ~0) recovers the generating values.
TEST(Search, ChoicePseudoCountKeepsAOnceMeasuredEffectOutOfItsClock) {
  SearchSpace space;
  space.freqs_mhz = {1000, 1100, 1200, 1300, 1400, 1500};
  space.sms = {3, 6, 9};
  space.slots = {"linear"};
  auto truth = [](int mhz, int sms) {
    const double a = 0.3 * std::log(1000.0 / mhz) + 1e-4 * (mhz - 1250) * (mhz - 1250) / 1e3;
    const double b = sms == 3 ? 0.4 : sms == 9 ? 0.05 : 0.0;
    return a + b;
  };
  std::vector<PartitionConfig> configs;
  std::vector<double> log_y;
  for (int f : space.freqs_mhz) {
    for (int m : {6, 9}) {
      configs.push_back({f, m, "linear"});
      log_y.push_back(truth(f, m));
    }
  }
  configs.push_back({1000, 3, "linear"});
  log_y.push_back(truth(1000, 3));
  for (double pseudo : {1.0, -1.0}) {
    const auto fit = additive_model_fit(space, configs, log_y, 0.0, pseudo);
    ASSERT_EQ(fit.size(), space.size());
    double worst = 0;  // over the configurations measured at every clock
    for (std::size_t i = 0; i < space.size(); ++i) {
      const auto c = space.at(i);
      if (c.sms == 3) continue;
      worst = std::max(worst, std::abs(fit[i] - truth(c.freq_mhz, c.sms)));
    }
    if (pseudo > 0) {
      EXPECT_GT(worst, 0.05) << "one pseudo-point leaks the effect into its clock";
    } else {
      EXPECT_LT(worst, 1e-3);
      // The once-measured choice keeps its whole effect, at its clock and beyond.
      EXPECT_NEAR(fit[0 * 3 + 0], truth(1000, 3), 1e-3);
      EXPECT_NEAR(fit[5 * 3 + 0], truth(1500, 3), 1e-3);
    }
  }
}

// The clock effect's smoother against hand-solved systems.
TEST(Search, ClockEffectIsAWhittakerSmoother) {
  // Three even clocks, one point each, sums (0, 1, 0), penalty 1: (I + D'D) a = s with
  // D = (1, -2, 1) gives a = (2/7, 3/7, 2/7).
  auto a = whittaker_clock_effect({900, 930, 960}, {1, 1, 1}, {0, 1, 0}, 1.0);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_NEAR(a[0], 2.0 / 7, 1e-9);
  EXPECT_NEAR(a[1], 3.0 / 7, 1e-9);
  EXPECT_NEAR(a[2], 2.0 / 7, 1e-9);
  // Penalty 0: the per-clock means (up to the 1e-9 ridge).
  a = whittaker_clock_effect({900, 930, 960}, {2, 4, 1}, {1, 2, -3}, 0.0);
  EXPECT_NEAR(a[0], 0.5, 1e-8);
  EXPECT_NEAR(a[1], 0.5, 1e-8);
  EXPECT_NEAR(a[2], -3.0, 1e-8);
  // A response linear in the clock is not penalized, on uneven clocks too, and a clock without
  // points is interpolated on the line (and extrapolated beyond the measured ones).
  const std::vector<int> f = {800, 900, 930, 1000, 1200};
  auto line = [](int mhz) { return 0.5 - 0.002 * mhz; };
  std::vector<int> n = {0, 3, 0, 2, 1};
  std::vector<double> s;
  for (std::size_t i = 0; i < f.size(); ++i) s.push_back(n[i] * line(f[i]));
  a = whittaker_clock_effect(f, n, s, 1e4);
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(a[i], line(f[i]), 1e-6) << f[i];
  // A huge penalty on curved data: the least-squares line through the points. Points at
  // x = 0, 1, 2 (one each, even steps) with values 0, 1, 0: the line is 1/3.
  a = whittaker_clock_effect({900, 930, 960}, {1, 1, 1}, {0, 1, 0}, 1e9);
  for (double v : a) EXPECT_NEAR(v, 1.0 / 3, 1e-6);
}

TEST(Search, FrontsPerFrequencyMatchBruteForce) {
  Fixture f;
  const auto& p = f.ps.partition("fwd_attn");
  SearchOptions o;
  o.budget = 224;
  const auto r =
      create_search_strategy("mbo")->run(p, make_search_space(p, f.w.gpu()), f.cp, o, {});
  ASSERT_EQ(r.estimates.size(), r.points.size());  // per clock on the estimates
  const auto fronts = r.fronts_per_frequency();
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const int f_mhz = r.points[i].config.freq_mhz;
    const Measurement& a = r.estimates[i];
    bool dominated = false;
    for (std::size_t k = 0; k < r.points.size(); ++k) {
      const Measurement& b = r.estimates[k];
      if (r.points[k].config.freq_mhz != f_mhz) continue;
      if (b.time_s <= a.time_s && b.dynamic_energy_j <= a.dynamic_energy_j &&
          (b.time_s < a.time_s || b.dynamic_energy_j < a.dynamic_energy_j)) {
        dominated = true;
      }
    }
    const auto& fr = fronts.at(f_mhz);
    const bool in = std::find(fr.begin(), fr.end(), i) != fr.end();
    EXPECT_EQ(in, !dominated) << i;
  }
}

// A separable truth, time (1000 / f) x T[s] and dynamic energy (f / 1000)^2 x E[s], measured
// for every SM count at 1000 and 1200 MHz and none at 1100: the additive model's clock effects
// are shared by every choice, so the predicted front at 1100 is the true one, worked out by
// hand. SM counts 1-5 trade time for energy; 6 is as fast as 5 for more energy (dominated).
TEST(Search, PredictedClockFrontIsTheTrueFrontOfASeparableTruth) {
  SearchSpace space;
  space.freqs_mhz = {1000, 1100, 1200};
  space.sms = {1, 2, 3, 4, 5, 6};
  space.slots = {"start"};
  const double t[] = {6.0, 5.0, 4.0, 3.5, 3.4, 3.4};
  const double e[] = {1.0, 1.1, 1.3, 1.6, 2.0, 2.5};
  auto truth = [&](int f, int s) -> SearchPoint {
    const double time_s = 1000.0 / f * t[s - 1];
    const double dyn_j = std::pow(f / 1000.0, 2) * e[s - 1];
    return {{f, s, "start"}, {time_s, dyn_j + 100 * time_s, dyn_j, 100 * time_s}};
  };
  std::vector<SearchPoint> points;
  for (int f : {1000, 1200}) {
    for (int s = 1; s <= 6; ++s) points.push_back(truth(f, s));
  }
  const SearchOptions o;
  auto sms_of = [](const std::vector<PartitionConfig>& v) {
    std::vector<int> out;
    for (const auto& c : v) {
      EXPECT_EQ(c.freq_mhz, 1100);
      EXPECT_EQ(c.slot, "start");
      out.push_back(c.sms);
    }
    return out;
  };
  // The front, fastest first, then the next layer (the dominated 6 SMs).
  EXPECT_EQ(sms_of(predicted_clock_front(points, space, o, 1100, 10)),
            (std::vector<int>{5, 4, 3, 2, 1, 6}));
  EXPECT_EQ(sms_of(predicted_clock_front(points, space, o, 1100, 5)),
            (std::vector<int>{5, 4, 3, 2, 1}));
  // Room for 3 of the 5: both ends and the middle.
  EXPECT_EQ(sms_of(predicted_clock_front(points, space, o, 1100, 3)), (std::vector<int>{5, 3, 1}));
  // A measured choice is not asked for again.
  points.push_back(truth(1100, 3));
  EXPECT_EQ(sms_of(predicted_clock_front(points, space, o, 1100, 10)),
            (std::vector<int>{5, 4, 2, 1, 6}));
  // Every choice measured at 1000 MHz; 1300 MHz is not in the space.
  EXPECT_TRUE(predicted_clock_front(points, space, o, 1000, 10).empty());
  EXPECT_TRUE(predicted_clock_front(points, space, o, 1300, 10).empty());
  EXPECT_TRUE(predicted_clock_front(points, space, o, 1100, 0).empty());
}

// Two points at one clock: the per-clock front (what the planner composes) follows the estimates
// when the strategy made them, the measurements otherwise.
TEST(Search, FrontsPerFrequencyFollowTheEstimates) {
  SearchResult r;
  for (const auto& [sms, time_s, energy_j] :
       {std::tuple{6, 1.00, 300.0}, std::tuple{9, 1.01, 303.0}}) {
    SearchPoint pt;
    pt.config.freq_mhz = 1410;
    pt.config.sms = sms;
    pt.config.slot = "linear";
    pt.m = make_measurement(time_s, energy_j, 100);
    r.points.push_back(pt);
  }
  EXPECT_EQ(r.fronts_per_frequency().at(1410), std::vector<std::size_t>{0});
  r.estimates = {make_measurement(1.02, 306, 100), make_measurement(1.00, 300, 100)};
  EXPECT_EQ(r.fronts_per_frequency().at(1410), std::vector<std::size_t>{1});
  EXPECT_DOUBLE_EQ(r.estimate(1).time_s, 1.00);
  EXPECT_DOUBLE_EQ(r.estimate(0).dynamic_energy_j, 306 - 102);
}

// mbo's estimates are what the planner composes: closer to the truth than the measurements of
// the points it recommends (those are the lucky draws), with the energy split at the backend's
// static power; without noise they are the measurements.
TEST(Search, EstimatesAreCloserToTheTruthThanTheSelectedMeasurements) {
  Fixture f;
  const auto& p = f.ps.partition("bwd_mlp");
  const auto space = make_search_space(p, f.w.gpu());
  SearchOptions o;
  const auto r = create_search_strategy("mbo")->run(p, space, f.cp, o, {});
  ASSERT_EQ(r.estimates.size(), r.points.size());
  EXPECT_EQ(r.selected, select_front(r.points, space, o));
  EmulatorProfiler oracle{test::emulator_options(f.w.gpu_name, 0.0, 1)};
  double err_est = 0, err_meas = 0;
  for (std::size_t i : r.selected) {
    const Measurement& e = r.estimates[i];
    EXPECT_NEAR(e.static_energy_j, f.prof.static_power_w() * e.time_s, 1e-9 * e.energy_j);
    EXPECT_NEAR(e.dynamic_energy_j + e.static_energy_j, e.energy_j, 1e-9 * e.energy_j);
    const Measurement t = oracle.measure(p, r.points[i].config);
    const Measurement& m = r.points[i].m;
    err_est +=
        std::abs(std::log(e.time_s / t.time_s)) + std::abs(std::log(e.energy_j / t.energy_j));
    err_meas +=
        std::abs(std::log(m.time_s / t.time_s)) + std::abs(std::log(m.energy_j / t.energy_j));
  }
  err_est /= static_cast<double>(r.selected.size());
  err_meas /= static_cast<double>(r.selected.size());
  // Measured: 0.60 of the measurements' error (0.0049 against 0.0081, 21 + 7 schedule).
  EXPECT_LT(err_est, 0.67 * err_meas) << err_est << " vs " << err_meas;

  // A noise-free backend: the automatic noise is 0, every weight 1, the estimates are the
  // measurements and the recommendation is the measured front.
  EmulatorProfiler exact{test::emulator_options(f.w.gpu_name, 0.0, 1)};
  CachedProfiler cp{exact, nullptr};
  const auto x = create_search_strategy("mbo")->run(p, space, cp, o, {});
  ASSERT_EQ(x.estimates.size(), x.points.size());
  for (std::size_t i = 0; i < x.points.size(); ++i) {
    EXPECT_NEAR(x.estimates[i].time_s, x.points[i].m.time_s, 1e-12 * x.points[i].m.time_s);
    EXPECT_NEAR(x.estimates[i].energy_j, x.points[i].m.energy_j, 1e-12 * x.points[i].m.energy_j);
  }
  EXPECT_EQ(x.selected, x.front());
}

// Each objective is smoothed by its own noise: with exact times and 1% energy noise the time
// estimates are the measured times (weight 1), the energies are not; and the resolution of the
// options: the backend's noise for both, or kTimeNoiseShare x an explicit noise_rel.
TEST(Search, EachObjectiveIsSmoothedByItsOwnNoise) {
  Fixture f;
  const auto& p = f.ps.partition("bwd_mlp");
  const auto space = make_search_space(p, f.w.gpu());
  auto po = test::emulator_options(f.w.gpu_name, 0.01, 1);
  po.time_noise = 0;
  EmulatorProfiler exact_time{po};
  CachedProfiler cp{exact_time, nullptr};
  ASSERT_EQ(exact_time.noise_rel(), (NoiseRel{0.0, 0.01}));
  SearchOptions o;
  const auto r = create_search_strategy("mbo")->run(p, space, cp, o, {});
  ASSERT_EQ(r.estimates.size(), r.points.size());
  std::size_t energy_moved = 0;
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    EXPECT_NEAR(r.estimates[i].time_s, r.points[i].m.time_s, 1e-12 * r.points[i].m.time_s);
    energy_moved += std::abs(r.estimates[i].energy_j / r.points[i].m.energy_j - 1) > 1e-4;
  }
  EXPECT_GT(energy_moved, r.points.size() / 2);
  // Without a backend: the same estimates from noise_rel 0.01 and time_noise_rel 0; noise_rel
  // 0.01 alone puts 0.1% on time, so the times move too.
  SearchOptions given;
  given.noise_rel = 0.01;
  given.time_noise_rel = 0;
  const auto same = smoothed_estimates(r.points, space, given);
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    EXPECT_EQ(same[i].time_s, r.estimates[i].time_s);
    EXPECT_EQ(same[i].energy_j, r.estimates[i].energy_j);
  }
  given.time_noise_rel = -1;
  const auto shared = smoothed_estimates(r.points, space, given);
  std::size_t time_moved = 0;
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    time_moved += shared[i].time_s != r.points[i].m.time_s;
  }
  EXPECT_GT(time_moved, 0u);
}

TEST(Search, LatinHypercubeAndStoppingRule) {
  Fixture f;
  const auto& p = f.ps.partition("fwd_attn");
  const auto space = make_search_space(p, f.w.gpu());
  SearchOptions o;
  o.initial_design = "lhs";
  o.budget = 96;
  o.initial_points = 224;  // the whole budget is the initial design
  const auto r = create_search_strategy("mbo")->run(p, space, f.cp, o, {});
  // 96 points over 18 clocks: every clock is used, none more than ceil(96/18)+1 times.
  std::map<int, int> per_freq;
  for (const auto& x : r.points) ++per_freq[x.config.freq_mhz];
  EXPECT_EQ(per_freq.size(), 18u);
  for (const auto& [fq, n] : per_freq) EXPECT_LE(n, 7) << fq;
  SearchOptions s;
  s.stop_threshold = 0.5;  // no batch adds half the hypervolume: stops after `patience` batches
  const auto st = create_search_strategy("mbo")->run(p, space, f.cp, s, {});
  EXPECT_EQ(s.stop_patience, 8);
  EXPECT_TRUE(st.stopped_early);
  EXPECT_EQ(st.batches, 8);
  EXPECT_EQ(st.evaluations, 21 + 8 * 7);
  s.stop_patience = 1;
  const auto st1 = create_search_strategy("mbo")->run(p, space, f.cp, s, {});
  EXPECT_TRUE(st1.stopped_early);
  EXPECT_EQ(st1.batches, 1);
  EXPECT_EQ(st1.evaluations, 21 + 7);
  // A stopped search measured a prefix of the full one (the schedule is budget-independent).
  SearchOptions full;
  const auto fr = create_search_strategy("mbo")->run(p, space, f.cp, full, {});
  // The default initial design is the Latin hypercube: its 21 points reach more of the 18
  // clocks before the first refit than 21 random points do (the surrogate can only extrapolate
  // to a clock it has not seen). Over 10 seeds: at least 15 clocks each time, and more on average
  // than random (a random design of 21 leaves 18 x (17/18)^21 = 5.4 out on average, with
  // replacement). The clock strata are 18/21 of a clock wide, so a clock can hold no whole
  // stratum and be skipped: not all 18 are guaranteed.
  EXPECT_EQ(full.initial_design, "lhs");
  EXPECT_EQ(full.initial_points, 21);
  auto clocks_of_design = [&](const std::string& design, std::uint64_t seed) {
    SearchOptions d;
    d.initial_design = design;
    d.seed = seed;
    d.budget = d.initial_points;
    const auto r = create_search_strategy("mbo")->run(p, space, f.cp, d, {});
    std::set<int> clocks;
    for (const auto& x : r.points) clocks.insert(x.config.freq_mhz);
    return static_cast<int>(clocks.size());
  };
  int lhs_total = 0, random_total = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const int n = clocks_of_design("lhs", seed);
    EXPECT_GE(n, 15) << seed;
    lhs_total += n;
    random_total += clocks_of_design("random", seed);
  }
  EXPECT_GT(lhs_total, random_total + 10) << lhs_total << " vs " << random_total;
  auto prefix = configs(fr);
  prefix.resize(st.points.size());
  EXPECT_EQ(configs(st), prefix);
  SearchOptions bad;
  bad.share_fastest = 0.5;
  EXPECT_THROW(create_search_strategy("mbo")->run(p, space, f.cp, bad, {}), InvalidInput);
}

TEST(Search, ResumesFromTheStore) {
  test::TempDir tmp;
  const std::string wl = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const std::string args = "search " + wl +
                           " --partition fwd_mlp --strategy mbo --budget 120 "
                           "--seed 3 --json --quiet --db " +
                           tmp.file("s.db");
  const auto a = test::run_cli(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto b = test::run_cli(args);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja.at("evaluations"), 120);
  EXPECT_EQ(ja.at("resumed"), 0);
  EXPECT_EQ(jb.at("resumed"), 120);
  EXPECT_EQ(ja.at("points"), [&] {
    auto p = jb.at("points");
    for (auto& x : p) x["from_store"] = false;
    return p;
  }());
  EXPECT_FALSE(ja.at("front").empty());
  for (const auto& fp : ja.at("front")) {
    for (const char* k : {"freq_mhz", "sms", "slot", "time_s", "energy_j"})
      EXPECT_TRUE(fp.contains(k));
  }
  // measured_front is the Pareto set of the points on (time, energy), by brute force; the
  // recommended front is a subset of the points.
  const auto& pts = ja.at("points");
  nlohmann::json brute = nlohmann::json::array();
  for (const auto& q : pts) {
    bool dominated = false;
    for (const auto& o : pts) {
      const double ot = o.at("time_s"), oe = o.at("energy_j"), qt = q.at("time_s"),
                   qe = q.at("energy_j");
      dominated = dominated || (ot <= qt && oe <= qe && (ot < qt || oe < qe));
    }
    if (!dominated) brute.push_back(q);
  }
  auto sorted = [](nlohmann::json a) {
    std::sort(a.begin(), a.end(), [](const auto& x, const auto& y) { return x.dump() < y.dump(); });
    return a;
  };
  EXPECT_EQ(sorted(ja.at("measured_front")), sorted(brute));
  // mbo's recommended points carry the estimates they were chosen on.
  for (auto fp : ja.at("front")) {
    ASSERT_TRUE(fp.contains("estimate")) << fp.dump();
    for (const char* k : {"time_s", "energy_j", "dynamic_energy_j"})
      EXPECT_GT(fp.at("estimate").at(k).get<double>(), 0) << k;
    fp.erase("estimate");
    EXPECT_NE(std::find(pts.begin(), pts.end(), fp), pts.end()) << fp.dump();
  }
}

TEST(Search, InvalidStrategyListsValidOnes) {
  const auto r = test::run_cli("search " + test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096") +
                               " --partition fwd_mlp --strategy bayes");
  EXPECT_EQ(r.exit_code, 2);
  for (const char* n : {"mbo", "random", "exhaustive"}) {
    EXPECT_NE(r.err.find(n), std::string::npos) << r.err;
  }
}

// The strategies form a name registry like the profiling backends: a registered strategy is
// listed, created by name and named in the unknown-name error.
TEST(Search, RegistryCreatesRegisteredStrategies) {
  EXPECT_EQ(search_strategy_names(), (std::vector<std::string>{"exhaustive", "mbo", "random"}));
  class FirstPoint : public SearchStrategy {
   public:
    std::string name() const override { return "first-point"; }
    SearchResult run(const Partition&, const SearchSpace&, CachedProfiler&, const SearchOptions&,
                     const SearchProgress&) override {
      SearchResult r;
      r.strategy = name();
      return r;
    }
  };
  EXPECT_TRUE(register_search_strategy("zz-first-point", [] {
    return std::unique_ptr<SearchStrategy>(std::make_unique<FirstPoint>());
  }));
  EXPECT_EQ(create_search_strategy("zz-first-point")->name(), "first-point");
  EXPECT_EQ(search_strategy_names().back(), "zz-first-point");
  try {
    create_search_strategy("bayes");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("exhaustive, mbo, random, zz-first-point"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kareus
