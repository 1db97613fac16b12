#include "kareus/screening.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/pareto.h"
#include "kareus/profiling_cost.h"
#include "test_util.h"

namespace kareus {
namespace {

Measurement at(double time_s, double energy_j) { return make_measurement(time_s, energy_j, 0); }

// Hand-computed: A and B form the front; C is behind A by log 1.01 = 0.00995 in both
// objectives, E behind B by log 1.04 = 0.0392 in energy, D far behind. With 1.6% screening
// noise and band 2 the threshold is 0.032.
TEST(ConfirmationCandidates, WithinTheBandNearestFirst) {
  const std::vector<Measurement> est = {at(1, 10), at(2, 5), at(1.01, 10.1), at(3, 20), at(2, 5.2)};
  const NoiseRel noise{0.001, 0.016};
  ScreeningOptions o;
  o.max_confirm_share = 1;
  EXPECT_EQ(confirmation_candidates(est, noise, o), (std::vector<std::size_t>{0, 1, 2}));
  o.band = 3;  // 0.048 takes E too
  EXPECT_EQ(confirmation_candidates(est, noise, o), (std::vector<std::size_t>{0, 1, 2, 4}));
  o.band = 0;  // the estimated front only
  EXPECT_EQ(confirmation_candidates(est, noise, o), (std::vector<std::size_t>{0, 1}));
  o.band = 3;
  o.max_confirm_share = 0.25;  // ceil(0.25 x 5) = 2, nearest first
  EXPECT_EQ(confirmation_candidates(est, noise, o), (std::vector<std::size_t>{0, 1}));
  o.max_confirm_share = 0.01;  // at least one
  EXPECT_EQ(confirmation_candidates(est, noise, o).size(), 1u);
  EXPECT_TRUE(confirmation_candidates({}, noise, o).empty());
  o.max_confirm_share = 0;
  EXPECT_THROW(confirmation_candidates(est, noise, o), InvalidInput);
  o.max_confirm_share = 0.25;
  o.band = -1;
  EXPECT_THROW(confirmation_candidates(est, noise, o), InvalidInput);
}

struct Fixture {
  Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  PartitionSet ps = partition_workload(w);
  const Partition& p = ps.partition("fwd_mlp");
  SearchSpace space = make_search_space(p, w.gpu());
  ProfilerOptions screen_o = screen_options();
  EmulatorProfiler screen{screen_o};
  EmulatorProfiler full{test::emulator_options(w.gpu_name, 0.01, 1)};

  ProfilerOptions screen_options() const {
    auto o = test::emulator_options(w.gpu_name, 0.01, 1);
    o.window_s = 2.0;
    return o;
  }

  /// Random search of `budget` points through `screen`.
  SearchResult random_search(CachedProfiler& screen, int budget) const {
    SearchOptions so;
    so.budget = budget;
    return create_search_strategy("random")->run(p, space, screen, so, {});
  }
};

// Random search through the screening backend, then confirmation: the candidates are exactly
// confirmation_candidates of the screened measurements, each confirmed estimate is the
// precision-weighted log mean of its two measurements (weights 1 / s^2, by hand), the rest keep
// their measurements, and the recommendation is the Pareto set of the confirmed estimates.
TEST(ConfirmFront, CombinesTheTwoWindowsByPrecision) {
  Fixture f;
  CachedProfiler screen(f.screen, nullptr), full(f.full, nullptr);
  const SearchResult r = f.random_search(screen, 56);
  ASSERT_EQ(r.points.size(), 56u);
  const NoiseRel sn = *f.screen.noise_rel(), fn = *f.full.noise_rel();
  ASSERT_NEAR(sn.energy, 0.01 * 0.0160 / 0.0106, 1e-12);
  std::vector<Measurement> measured;
  for (const auto& pt : r.points) measured.push_back(pt.m);
  ScreeningOptions o;
  const auto expect = confirmation_candidates(measured, sn, o);
  ASSERT_FALSE(expect.empty());
  EXPECT_LE(expect.size(), 14u);  // ceil(0.25 x 56)
  const ScreenedSearch s = confirm_front(r, f.p, full, sn, fn, o);
  EXPECT_EQ(s.confirmed, expect);
  EXPECT_EQ(s.confirm_measured, static_cast<int>(expect.size()));
  std::set<std::size_t> conf(s.confirmed.begin(), s.confirmed.end());
  std::vector<Point2> pts;
  for (std::size_t k = 0; k < s.confirmed.size(); ++k) {
    const std::size_t i = s.confirmed[k];
    const Measurement direct = f.full.measure(f.p, r.points[i].config);
    EXPECT_DOUBLE_EQ(s.full[k].energy_j, direct.energy_j);
    const double ws = 1 / (sn.energy * sn.energy), wf = 1 / (fn.energy * fn.energy);
    const double e = std::exp(
        (ws * std::log(r.points[i].m.energy_j) + wf * std::log(direct.energy_j)) / (ws + wf));
    const double t = std::sqrt(r.points[i].m.time_s * direct.time_s);  // equal time noise
    EXPECT_NEAR(s.result.estimate(i).energy_j / e, 1, 1e-12);
    EXPECT_NEAR(s.result.estimate(i).time_s / t, 1, 1e-12);
    EXPECT_NEAR(s.result.estimate(i).static_energy_j, 85.0 * s.result.estimate(i).time_s, 1e-9);
    pts.push_back({s.result.estimate(i).time_s, s.result.estimate(i).energy_j});
  }
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    if (!conf.count(i)) {
      EXPECT_EQ(s.result.estimate(i).energy_j, r.points[i].m.energy_j);
    }
  }
  std::vector<std::size_t> want;
  for (std::size_t j : pareto_front(pts)) want.push_back(s.confirmed[j]);
  EXPECT_EQ(s.result.selected, want);
}

// Pooled at the full window: a confirmed point's measurement is its combined estimate with the
// variance share 1 / (1 / s^2 + 1 / f^2) / f^2 = s^2 / (s^2 + f^2), a screening-only point keeps
// its measurement at s^2 / f^2 = (16.0 / 10.6)^2 (the H200's 2 s and 5 s repeatabilities).
TEST(PooledAtFullWindow, ScalesEveryPointToTheFullWindowsNoise) {
  Fixture f;
  CachedProfiler screen(f.screen, nullptr), full(f.full, nullptr);
  const SearchResult r = f.random_search(screen, 40);
  const NoiseRel sn = *f.screen.noise_rel(), fn = *f.full.noise_rel();
  const ScreenedSearch s = confirm_front(r, f.p, full, sn, fn, ScreeningOptions{});
  ASSERT_FALSE(s.confirmed.empty());
  EXPECT_EQ(s.screen_noise.energy, sn.energy);
  EXPECT_EQ(s.full_noise.energy, fn.energy);
  const SearchResult pooled = pooled_at_full_window(s);
  ASSERT_EQ(pooled.points.size(), r.points.size());
  EXPECT_EQ(pooled.selected, s.result.selected);
  const double ratio2 = (0.0160 / 0.0106) * (0.0160 / 0.0106);
  std::set<std::size_t> conf(s.confirmed.begin(), s.confirmed.end());
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    if (conf.count(i)) {
      EXPECT_EQ(pooled.points[i].m.energy_j, s.result.estimate(i).energy_j);
      EXPECT_EQ(pooled.points[i].m.time_s, s.result.estimate(i).time_s);
      EXPECT_NEAR(pooled.points[i].noise_var_scale, ratio2 / (ratio2 + 1), 1e-9);
    } else {
      EXPECT_EQ(pooled.points[i].m.energy_j, r.points[i].m.energy_j);
      EXPECT_NEAR(pooled.points[i].noise_var_scale, ratio2, 1e-9);
    }
  }
  // Noise-free full measurements leave nothing to scale by: every point counts as one.
  ScreenedSearch noise_free_full = s;
  noise_free_full.full_noise = {0, 0};
  const SearchResult exact = pooled_at_full_window(noise_free_full);
  for (const auto& pt : exact.points) EXPECT_EQ(pt.noise_var_scale, 1.0);
}

// mbo screened and confirmed through one store: 56 screening points and the confirmations are
// separate entries (the window is in the fingerprint), and a rerun measures nothing.
TEST(ScreenedSearch, ResumesFromTheStore) {
  Fixture f;
  test::TempDir tmp;
  const std::string db = tmp.file("p.db");
  SearchOptions so;
  so.budget = 56;
  int confirmed = 0;
  {
    ProfileStore store(db);
    CachedProfiler screen(f.screen, &store), full(f.full, &store);
    auto mbo = create_search_strategy("mbo");
    const ScreenedSearch s = screened_search(*mbo, f.p, f.space, screen, full, so, {});
    EXPECT_EQ(s.screen_measured, 56);
    confirmed = s.confirm_measured;
    EXPECT_GE(confirmed, 1);
    EXPECT_LE(confirmed, 14);
    EXPECT_EQ(store.count_all(), static_cast<std::size_t>(56 + confirmed));
    for (std::size_t i : s.result.selected) {
      EXPECT_NE(std::find(s.confirmed.begin(), s.confirmed.end(), i), s.confirmed.end());
    }
  }
  ProfileStore store(db);
  CachedProfiler screen(f.screen, &store), full(f.full, &store);
  auto mbo = create_search_strategy("mbo");
  const ScreenedSearch again = screened_search(*mbo, f.p, f.space, screen, full, so, {});
  EXPECT_EQ(again.screen_measured, 0);
  EXPECT_EQ(again.confirm_measured, 0);
  EXPECT_EQ(static_cast<int>(again.confirmed.size()), confirmed);
}

TEST(ScreeningNoise, BackendOrTheH200AtTheWindow) {
  Fixture f;
  EXPECT_EQ(screening_noise(f.screen, 99), *f.screen.noise_rel());  // the emulator knows its own
}

TEST(ProfilingCost, ScreeningByHand) {
  const ProfilingCostEstimate e = estimate_profiling_cost(14, 8, 56, 2.0, 2.0);
  EXPECT_DOUBLE_EQ(e.wall_s(), 14 * 10.0 + 56 * 4.0);
  EXPECT_DOUBLE_EQ(e.gpu_s(), (14 * 10.0 + 56 * 4.0) * 8);
  EXPECT_DOUBLE_EQ(e.gpu_hours(), e.gpu_s() / 3600);
  EXPECT_EQ(e.describe(),
            "0.8 GPU-hours, 6m04s on one 8-GPU node (estimate: 56 screened x (2 s window + 2 s "
            "cool-down) + 14 configurations x (5 s window + 5 s cool-down), one node per "
            "measurement)");
  EXPECT_EQ(e.to_json().at("screen_points").get<int>(), 56);
  EXPECT_DOUBLE_EQ(e.to_json().at("gpu_s").get<double>(), e.gpu_s());
  EXPECT_THROW(estimate_profiling_cost(1, 8, 5, 0, 1), InvalidInput);
  EXPECT_THROW(estimate_profiling_cost(1, 8, 5, 2, -1), InvalidInput);
  EXPECT_NO_THROW(estimate_profiling_cost(1, 8, 0, 0, 0));
}

}  // namespace
}  // namespace kareus
