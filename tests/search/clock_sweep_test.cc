#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kareus/emulator.h"
#include "kareus/search.h"
#include "search/selection.h"
#include "test_util.h"

namespace kareus {
namespace {

// A sweep from log time and log total energy per clock, static power `static_power_w`.
std::vector<Measurement> sweep_of(const std::vector<double>& log_t,
                                  const std::vector<double>& log_e, double static_power_w) {
  std::vector<Measurement> s;
  for (std::size_t i = 0; i < log_t.size(); ++i) {
    s.push_back(make_measurement(std::exp(log_t[i]), std::exp(log_e[i]), static_power_w));
  }
  return s;
}

// A curve linear in log space over the clock has no second differences: every penalty keeps
// it, and the risk estimate picks the largest (fewest degrees of freedom).
TEST(SmoothClockSweep, KeepsALogLinearCurve) {
  const std::vector<int> f = {900, 960, 1020, 1080, 1140, 1200};
  std::vector<double> lt, le;
  for (int x : f) {
    lt.push_back(-3.0 - 0.0004 * x);
    le.push_back(2.0 + 0.0007 * x);
  }
  const auto in = sweep_of(lt, le, 60);
  const auto out = smooth_clock_sweep(f, in, kMeasuredNoiseRel);
  for (std::size_t i = 0; i < f.size(); ++i) {
    // Within the smoother's 1e-9 ridge, amplified by the largest penalty.
    EXPECT_NEAR(out[i].time_s / in[i].time_s, 1, 1e-7);
    EXPECT_NEAR(out[i].energy_j / in[i].energy_j, 1, 1e-7);
    EXPECT_NEAR(out[i].static_energy_j, 60 * out[i].time_s, 1e-9);
    EXPECT_NEAR(out[i].dynamic_energy_j, out[i].energy_j - out[i].static_energy_j, 1e-9);
  }
}

// Clocks without a measurement are filled in: on a log-linear curve measured at every third
// clock, exactly, with or without noise assumed.
TEST(SmoothClockSweep, FillsSkippedClocksOfALogLinearCurve) {
  std::vector<int> all, some;
  std::vector<double> lt, le;
  for (int x = 900; x <= 1410; x += 30) {
    all.push_back(x);
    if ((1410 - x) % 90 == 0 || x == 900) {
      some.push_back(x);
      lt.push_back(-3.0 - 0.0004 * x);
      le.push_back(2.0 + 0.0007 * x);
    }
  }
  ASSERT_EQ(some.size(), 7u);
  for (const NoiseRel noise : {kMeasuredNoiseRel, NoiseRel{0, 0}}) {
    const auto out = smooth_clock_sweep(some, sweep_of(lt, le, 60), noise, all);
    ASSERT_EQ(out.size(), all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      EXPECT_NEAR(std::log(out[i].time_s), -3.0 - 0.0004 * all[i], 1e-7) << all[i];
      EXPECT_NEAR(std::log(out[i].energy_j), 2.0 + 0.0007 * all[i], 1e-7) << all[i];
    }
  }
  // Fewer than 4 measured clocks: the nearest measurement (the faster one on a tie).
  const auto near =
      smooth_clock_sweep({900, 1020, 1140}, sweep_of({-3, -3.1, -3.2}, {2, 2.1, 2.2}, 60),
                         kMeasuredNoiseRel, {900, 960, 1080, 1140});
  EXPECT_NEAR(std::log(near[1].time_s), -3.1, 1e-12);
  EXPECT_NEAR(std::log(near[2].time_s), -3.2, 1e-12);
}

TEST(SmoothClockSweep, NoNoiseOrFewClocksLeaveTheSweep) {
  const std::vector<int> f = {900, 960, 1020, 1080};
  const auto in = sweep_of({-3, -2.9, -3.2, -3}, {1, 1.3, 0.8, 1}, 60);
  const auto same = smooth_clock_sweep(f, in, NoiseRel{0, 0});
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_EQ(same[i].energy_j, in[i].energy_j);
  const std::vector<int> three = {900, 960, 1020};
  const std::vector<Measurement> in3(in.begin(), in.begin() + 3);
  EXPECT_EQ(smooth_clock_sweep(three, in3, kMeasuredNoiseRel)[1].energy_j, in3[1].energy_j);
  EXPECT_THROW(smooth_clock_sweep(three, in, kMeasuredNoiseRel), std::invalid_argument);
  EXPECT_THROW(smooth_clock_sweep({900, 1020, 960, 1080}, in, kMeasuredNoiseRel),
               std::invalid_argument);
}

// The smoother's degrees of freedom at the two ends of the penalty, known without computing:
// no penalty interpolates (trace k), an infinite one leaves the least-squares line (trace 2).
TEST(SmoothClockSweep, HatTraceAtThePenaltysEnds) {
  const std::vector<double> x = {900, 930, 960, 1000, 1050};
  const std::vector<int> n(5, 1);
  const std::vector<double> y = {0.1, -0.2, 0.3, 0.0, 0.05};
  double dof = 0;
  const auto z0 = whittaker_smooth(x, n, y, 0, &dof);
  EXPECT_NEAR(dof, 5, 1e-6);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(z0[i], y[i], 1e-8);
  whittaker_smooth(x, n, y, 1e9, &dof);
  EXPECT_NEAR(dof, 2, 1e-3);
}

// The smoothed value's variance per unit draw variance, at the penalty's two ends: without a
// penalty each position is its own mean (1 / n); with an infinite one, the least-squares line,
// whose variance at x is the regression's leverage 1/3 + x^2 / 2 at x = -1, 0, 1 (one point
// each), and 1/6 + x^2 / 4 with two points at every position.
TEST(SmoothClockSweep, VarianceFactorAtThePenaltysEnds) {
  const std::vector<double> x = {-1, 0, 1}, y(3, 0.0);
  std::vector<double> var;
  whittaker_smooth(x, {1, 2, 4}, y, 0, nullptr, &var);
  EXPECT_NEAR(var[0], 1.0, 1e-6);
  EXPECT_NEAR(var[1], 0.5, 1e-6);
  EXPECT_NEAR(var[2], 0.25, 1e-6);
  whittaker_smooth(x, {1, 1, 1}, y, 1e9, nullptr, &var);
  EXPECT_NEAR(var[0], 5.0 / 6, 1e-4);
  EXPECT_NEAR(var[1], 1.0 / 3, 1e-4);
  EXPECT_NEAR(var[2], 5.0 / 6, 1e-4);
  whittaker_smooth(x, {2, 2, 2}, y, 1e9, nullptr, &var);
  EXPECT_NEAR(var[0], 5.0 / 12, 1e-4);
  EXPECT_NEAR(var[1], 1.0 / 6, 1e-4);
}

// Brute force: a 5-clock sweep with uneven steps, smoothed by solving (I + p D'D) z = y with
// an explicit inverse (Gauss-Jordan with partial pivoting, written here), the risk
// RSS + 2 s^2 tr((I + p D'D)^-1) evaluated on the same grid of penalties, the best z compared
// with smooth_clock_sweep's energy.
TEST(SmoothClockSweep, PicksTheLeastEstimatedRiskByBruteForce) {
  const std::vector<int> f = {900, 930, 960, 1020, 1080};
  const std::vector<double> le = {2.00, 2.012, 1.992, 2.01, 2.02};  // wiggles of the noise's size
  const double s = 0.01;
  const auto out =
      smooth_clock_sweep(f, sweep_of({-3, -3.02, -3.05, -3.1, -3.15}, le, 0), NoiseRel{0.001, s});
  const int k = 5;
  const double step = (f.back() - f.front()) / 4.0;
  double dmat[3][5] = {};
  for (int c = 1; c + 1 < k; ++c) {
    const double h1 = f[c] - f[c - 1], h2 = f[c + 1] - f[c];
    dmat[c - 1][c - 1] = 2 * step * step / (h1 * (h1 + h2));
    dmat[c - 1][c] = -2 * step * step / (h1 * h2);
    dmat[c - 1][c + 1] = 2 * step * step / (h2 * (h1 + h2));
  }
  double best_risk = 1e300;
  std::vector<double> best;
  for (int q = -16; q <= 24; ++q) {
    const double p = std::pow(10.0, q / 4.0);
    double a[5][10] = {};
    for (int i = 0; i < k; ++i) {
      a[i][i] += 1;
      a[i][k + i] = 1;
      for (int j = 0; j < k; ++j) {
        for (int r = 0; r < 3; ++r) a[i][j] += p * dmat[r][i] * dmat[r][j];
      }
    }
    for (int c = 0; c < k; ++c) {
      int piv = c;
      for (int r = c + 1; r < k; ++r) {
        if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
      }
      for (int j = 0; j < 2 * k; ++j) std::swap(a[c][j], a[piv][j]);
      const double d = a[c][c];
      for (int j = 0; j < 2 * k; ++j) a[c][j] /= d;
      for (int r = 0; r < k; ++r) {
        if (r == c) continue;
        const double m = a[r][c];
        for (int j = 0; j < 2 * k; ++j) a[r][j] -= m * a[c][j];
      }
    }
    std::vector<double> z(k, 0.0);
    double trace = 0, rss = 0;
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < k; ++j) z[i] += a[i][k + j] * le[j];
      trace += a[i][k + i];
      rss += (z[i] - le[i]) * (z[i] - le[i]);
    }
    const double risk = rss + 2 * s * s * trace;
    if (risk < best_risk) {
      best_risk = risk;
      best = z;
    }
  }
  for (int i = 0; i < k; ++i) EXPECT_NEAR(std::log(out[i].energy_j), best[i], 1e-6) << i;
  // It did smooth: the middle dip is lifted toward its neighbours.
  EXPECT_GT(std::log(out[2].energy_j), le[2] + 0.005);
}

// On the emulator, against its noise-free sweeps (the oracle): every instruction segment of a
// paper workload (A100) and of two zoo jobs (H100, H200) at every candidate clock, 4 noise
// seeds. The smoothed sweeps must be clearly closer to the truth than the raw ones (RMS of the
// log error over all points) in dynamic energy, which the plans are chosen on, and in time;
// filled in from every 2nd or 3rd clock (PlannerOptions::sweep_stride), still in energy.
TEST(SmoothClockSweep, CloserToTheNoiseFreeEmulatorOnRealSegments) {
  for (const std::string& path :
       {test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096"),
        test::source_path("workloads/zoo/llama3.1-70b_h100_tp8_sp_pp8_seq4k_mb32.yaml"),
        test::source_path("workloads/zoo/llama3.1-8b_h200_tp4_sp_cp4_pp2_seq64k.yaml")}) {
    const Workload w = load_workload(path);
    const PartitionSet ps = partition_workload(w);
    std::vector<int> f = w.gpu().candidate_freqs_mhz();
    std::sort(f.begin(), f.end());
    ASSERT_GE(f.size(), 10u);
    EmulatorProfiler truth(test::emulator_options(w.gpu_name, 0, 1));
    // Every 2nd and every 3rd clock from the fastest, and the slowest (sweep_stride 2, 3).
    std::vector<int> strided[2];
    for (std::size_t i = 0; i < f.size(); ++i) {
      for (int k = 0; k < 2; ++k) {
        if (i == 0 || (f.size() - 1 - i) % static_cast<std::size_t>(k + 2) == 0) {
          strided[k].push_back(f[i]);
        }
      }
    }
    double raw_e = 0, smooth_e = 0, raw_t = 0, smooth_t = 0, stride_e[2] = {}, stride_t[2] = {};
    int n = 0;
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      EmulatorProfiler noisy(test::emulator_options(w.gpu_name, 0.01, seed));
      for (const Segment& s : ps.segments) {
        std::vector<Measurement> exact, measured;
        for (int x : f) {
          exact.push_back(truth.measure_segment(s, x));
          measured.push_back(noisy.measure_segment(s, x));
        }
        if (exact.front().dynamic_energy_j <= 0) continue;
        const auto smoothed = smooth_clock_sweep(f, measured, *noisy.noise_rel());
        std::vector<Measurement> filled[2];
        for (int k = 0; k < 2; ++k) {
          std::vector<Measurement> some;
          for (std::size_t i = 0; i < f.size(); ++i) {
            if (std::binary_search(strided[k].begin(), strided[k].end(), f[i])) {
              some.push_back(measured[i]);
            }
          }
          filled[k] = smooth_clock_sweep(strided[k], some, *noisy.noise_rel(), f);
        }
        for (std::size_t i = 0; i < f.size(); ++i) {
          auto sq = [](double x, double y) { return std::pow(std::log(x / y), 2); };
          raw_e += sq(measured[i].dynamic_energy_j, exact[i].dynamic_energy_j);
          smooth_e += sq(smoothed[i].dynamic_energy_j, exact[i].dynamic_energy_j);
          raw_t += sq(measured[i].time_s, exact[i].time_s);
          smooth_t += sq(smoothed[i].time_s, exact[i].time_s);
          for (int k = 0; k < 2; ++k) {
            stride_e[k] += sq(filled[k][i].dynamic_energy_j, exact[i].dynamic_energy_j);
            stride_t[k] += sq(filled[k][i].time_s, exact[i].time_s);
          }
          ++n;
        }
      }
    }
    ASSERT_GT(n, 0);
    const double re = std::sqrt(raw_e / n), se = std::sqrt(smooth_e / n);
    const double rt = std::sqrt(raw_t / n), st = std::sqrt(smooth_t / n);
    double se2[2], st2[2];
    for (int k = 0; k < 2; ++k) {
      se2[k] = std::sqrt(stride_e[k] / n);
      st2[k] = std::sqrt(stride_t[k] / n);
    }
    std::printf(
        "%s: %d points, RMS error of dynamic energy %.4f%% raw, %.4f%% smoothed, %.4f%% / %.4f%% "
        "from every 2nd / 3rd clock; time %.4f%% / %.4f%% / %.4f%% / %.4f%%\n",
        w.name.c_str(), n, 100 * re, 100 * se, 100 * se2[0], 100 * se2[1], 100 * rt, 100 * st,
        100 * st2[0], 100 * st2[1]);
    EXPECT_LT(se, 0.65 * re) << w.name;
    EXPECT_LT(st, 0.8 * rt) << w.name;
    // From a half or a third of the measurements: still clearly better in energy; in time about
    // as good from half, up to a third worse from a third (the curvature between measured
    // clocks is then what the smoother must guess).
    EXPECT_LT(se2[0], 0.75 * re) << w.name;
    EXPECT_LT(st2[0], 1.05 * rt) << w.name;
    EXPECT_LT(se2[1], 0.75 * re) << w.name;
    EXPECT_LT(st2[1], 1.4 * rt) << w.name;
  }
}

}  // namespace
}  // namespace kareus
