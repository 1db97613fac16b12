// Smoothing a clock sweep: one measurement per SM clock of the same work (a segment, a
// baseline's partition at NCCL's defaults). The planner composes every instruction from such
// sweeps, and with 1% energy noise per point a favourable draw at one clock can move the clock
// choice of a whole stage (docs/search.md, "Budget and stopping"). Adjacent clocks run the same
// kernels, so their log time and log energy lie on smooth curves: a Whittaker smoother (Eilers,
// "A perfect smoother", Analytical Chemistry 2003) on each objective pools the neighbours.
//
// The penalty is chosen per sweep and objective, not tuned: the noise of a measurement is known
// (the backend's repeatability, s in logs), so the smoother's risk has an unbiased estimate,
// Mallows' Cp / Stein's unbiased risk estimate (Mallows, Technometrics 1973; Stein, Annals of
// Statistics 1981): RSS(lambda) + 2 s^2 tr H(lambda), minimised over a grid of penalties. A
// kinked curve (the power cap's plateau, a roofline knee) keeps a small penalty, a curve whose
// wiggles are all noise gets a large one. Energy is smoothed as the total, on which the noise
// falls; the dynamic share, a difference, is 1.4-2.6 times noisier in relative terms. Against
// the noise-free emulator, over every segment of three workloads (A100, H100, H200) x 4 seeds,
// this left 0.73-1.42% RMS error in dynamic energy where the raw sweeps had 1.41-2.64%, and
// 0.04-0.07% in time where they had 0.10% (tests/search/clock_sweep_test.cc). A
// moment estimate of the curvature (second differences less their noise share) was tried first:
// it often found none where the curvature per clock step is below the noise, fitted a straight
// line and made the times of long sweeps worse, up to 1.2% RMS.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kareus/search.h"
#include "selection.h"

namespace kareus {

namespace {

// The smoothed curve of y (log values at clocks x, counts[i] measurements behind y[i], 0 for a
// clock only to be filled in) for noise s.d. s (relative, so in logs).
std::vector<double> smooth(const std::vector<double>& x, const std::vector<int>& counts,
                           const std::vector<double>& y, double s) {
  const bool gaps = std::find(counts.begin(), counts.end(), 0) != counts.end();
  if (s <= 0 && !gaps) return y;
  std::vector<double> best;
  double best_risk = 0;
  // Penalties 1e-4 .. kMaxSweepPenalty in quarter decades. With s = 0 the risk is the residual
  // alone, least at the smallest penalty: the gaps are then filled by the smoothest curve
  // through the measurements.
  for (int q = -16; q <= 24; ++q) {
    const double penalty = std::min(std::pow(10.0, q / 4.0), kMaxSweepPenalty);
    double dof = 0;
    std::vector<double> z = whittaker_smooth(x, counts, y, penalty, &dof);
    double rss = 0;
    for (std::size_t i = 0; i < y.size(); ++i) rss += counts[i] * (z[i] - y[i]) * (z[i] - y[i]);
    const double risk = rss + 2 * s * s * dof;
    if (best.empty() || risk < best_risk) {
      best_risk = risk;
      best = std::move(z);
    }
  }
  return best;
}

void check_ascending(const std::vector<int>& freqs_mhz, const char* what) {
  for (std::size_t i = 1; i < freqs_mhz.size(); ++i) {
    if (freqs_mhz[i] <= freqs_mhz[i - 1]) {
      throw std::invalid_argument(std::string("smooth_clock_sweep: ") + what + " must ascend");
    }
  }
}

}  // namespace

std::vector<Measurement> smooth_clock_sweep(const std::vector<int>& freqs_mhz,
                                            const std::vector<Measurement>& sweep, NoiseRel noise) {
  return smooth_clock_sweep(freqs_mhz, sweep, noise, freqs_mhz);
}

std::vector<Measurement> smooth_clock_sweep(const std::vector<int>& freqs_mhz,
                                            const std::vector<Measurement>& sweep, NoiseRel noise,
                                            const std::vector<int>& at_mhz) {
  if (freqs_mhz.size() != sweep.size() || sweep.empty()) {
    throw std::invalid_argument("smooth_clock_sweep: one measurement per clock");
  }
  check_ascending(freqs_mhz, "clocks");
  check_ascending(at_mhz, "the clocks asked for");
  if (noise.time <= 0 && noise.energy <= 0 && at_mhz == freqs_mhz) return sweep;
  // The measurement at the nearest measured clock (the faster one on a tie): the fallback
  // where there is nothing to smooth.
  auto nearest = [&](int f) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < freqs_mhz.size(); ++i) {
      if (std::abs(freqs_mhz[i] - f) <= std::abs(freqs_mhz[best] - f)) best = i;
    }
    return sweep[best];
  };
  std::vector<Measurement> fallback;
  fallback.reserve(at_mhz.size());
  for (int f : at_mhz) fallback.push_back(nearest(f));
  // The union of measured and asked-for clocks, with the measurements' counts.
  std::vector<double> x;
  std::vector<int> counts;
  std::vector<double> log_t, log_e;
  std::size_t i = 0, j = 0;
  while (i < freqs_mhz.size() || j < at_mhz.size()) {
    const bool take_measured =
        j == at_mhz.size() || (i < freqs_mhz.size() && freqs_mhz[i] <= at_mhz[j]);
    const int f = take_measured ? freqs_mhz[i] : at_mhz[j];
    if (take_measured) {
      const Measurement& m = sweep[i];
      // A segment may take no dynamic energy (a message on an idle link): nothing to smooth.
      if (!(m.time_s > 0) || !(m.dynamic_energy_j > 0)) return fallback;
      if (j < at_mhz.size() && at_mhz[j] == f) ++j;
      ++i;
      x.push_back(f);
      counts.push_back(1);
      log_t.push_back(std::log(m.time_s));
      log_e.push_back(std::log(m.energy_j));
    } else {
      ++j;
      x.push_back(f);
      counts.push_back(0);
      log_t.push_back(0);
      log_e.push_back(0);
    }
  }
  if (freqs_mhz.size() < 4) return fallback;
  const std::vector<double> t = smooth(x, counts, log_t, noise.time);
  const std::vector<double> e = smooth(x, counts, log_e, noise.energy);
  const double static_power_w = sweep.front().static_energy_j / sweep.front().time_s;
  std::vector<Measurement> out;
  out.reserve(at_mhz.size());
  std::size_t k = 0;
  for (int f : at_mhz) {
    while (x[k] != f) ++k;
    Measurement o;
    o.time_s = std::exp(t[k]);
    o.energy_j = std::exp(e[k]);
    // Static energy is static power x time: it follows the smoothed time.
    o.static_energy_j = static_power_w * o.time_s;
    o.dynamic_energy_j = o.energy_j - o.static_energy_j;
    // Smoothing the total cannot leave less than the static share unless the sweep is not one
    // piece of work; keep the measurements then.
    if (!(o.dynamic_energy_j > 0)) return fallback;
    out.push_back(o);
  }
  return out;
}

}  // namespace kareus
