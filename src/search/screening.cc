// Multi-fidelity profiling (include/kareus/screening.h): screen with short windows, confirm the
// configurations near the estimated front with full ones, recommend from the confirmed.
// Measurements of one point at two fidelities are combined by precision weighting (the
// minimum-variance unbiased mean of independent estimates), in logs because the noise is
// relative.
#include "kareus/screening.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kareus/error.h"
#include "kareus/pareto.h"

namespace kareus {
namespace {

double log_of(double v) { return std::log(std::max(v, 1e-300)); }

// Precision-weighted mean of two log measurements with relative s.d. s1 and s2; an exact
// measurement (s = 0) wins outright.
double combine(double v1, double s1, double v2, double s2) {
  if (s2 <= 0) return v2;
  if (s1 <= 0) return v1;
  const double w1 = 1 / (s1 * s1), w2 = 1 / (s2 * s2);
  return std::exp((w1 * log_of(v1) + w2 * log_of(v2)) / (w1 + w2));
}

}  // namespace

NoiseRel screening_noise(const Profiler& backend, double window_s) {
  if (auto n = backend.noise_rel()) return *n;
  return noise_at_window(kMeasuredNoiseRel, window_s);
}

std::vector<std::size_t> confirmation_candidates(const std::vector<Measurement>& estimates,
                                                 NoiseRel screen_noise, const ScreeningOptions& o) {
  if (!(o.band >= 0) || !(o.max_confirm_share > 0 && o.max_confirm_share <= 1)) {
    throw InvalidInput(
        fmt::format("screening: band must be >= 0 and max_confirm_share in (0, 1], got {} and {}",
                    o.band, o.max_confirm_share));
  }
  const std::size_t n = estimates.size();
  if (n == 0) return {};
  std::vector<Point2> pts;
  pts.reserve(n);
  for (const auto& m : estimates) pts.push_back({m.time_s, m.energy_j});
  const std::vector<std::size_t> front = pareto_front(pts);
  std::vector<double> behind(n, std::numeric_limits<double>::infinity());
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t f : front) {
      behind[i] = std::min(behind[i], std::max(log_of(pts[i].x) - log_of(pts[f].x),
                                               log_of(pts[i].y) - log_of(pts[f].y)));
    }
  }
  const double threshold = o.band * screen_noise.energy;
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < n; ++i) {
    if (behind[i] <= threshold) idx.push_back(i);
  }
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return behind[a] < behind[b]; });
  const auto cap = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::ceil(o.max_confirm_share * static_cast<double>(n))));
  if (idx.size() > cap) idx.resize(cap);
  return idx;
}

ScreenedSearch confirm_front(SearchResult screened, const Partition& p, CachedProfiler& full,
                             NoiseRel screen_noise, NoiseRel full_noise,
                             const ScreeningOptions& o) {
  ScreenedSearch out;
  SearchResult& r = screened;
  if (r.estimates.empty()) {
    for (const auto& pt : r.points) r.estimates.push_back(pt.m);
  }
  out.confirmed = confirmation_candidates(r.estimates, screen_noise, o);
  std::vector<PartitionConfig> configs;
  for (std::size_t i : out.confirmed) configs.push_back(r.points[i].config);
  const int before = full.measured();
  out.full = full.measure_batch(p, configs);
  out.confirm_measured = full.measured() - before;
  out.screen_noise = screen_noise;
  out.full_noise = full_noise;
  const double static_w = full.backend().static_power_w();
  std::vector<Point2> pts;
  for (std::size_t k = 0; k < out.confirmed.size(); ++k) {
    const Measurement& s = r.points[out.confirmed[k]].m;
    const Measurement& f = out.full[k];
    const Measurement m = make_measurement(
        combine(s.time_s, screen_noise.time, f.time_s, full_noise.time),
        combine(s.energy_j, screen_noise.energy, f.energy_j, full_noise.energy), static_w);
    r.estimates[out.confirmed[k]] = m;
    pts.push_back({m.time_s, m.energy_j});
  }
  r.selected.clear();
  for (std::size_t j : pareto_front(pts)) r.selected.push_back(out.confirmed[j]);
  out.result = std::move(r);
  return out;
}

SearchResult pooled_at_full_window(ScreenedSearch sc) {
  SearchResult r = std::move(sc.result);
  const double s2 = sc.screen_noise.energy * sc.screen_noise.energy;
  const double f2 = sc.full_noise.energy * sc.full_noise.energy;
  // Exact measurements (noise 0) carry no weight to share: every point counts as one.
  const double screen_scale = f2 > 0 ? s2 / f2 : 1.0;
  const double confirmed_scale = f2 > 0 ? s2 / (s2 + f2) : 1.0;
  for (auto& pt : r.points) pt.noise_var_scale = screen_scale;
  for (std::size_t i : sc.confirmed) {
    r.points[i].m = r.estimates[i];
    r.points[i].noise_var_scale = confirmed_scale;
  }
  return r;
}

ScreenedSearch screened_search(SearchStrategy& strategy, const Partition& p,
                               const SearchSpace& space, CachedProfiler& screen,
                               CachedProfiler& full, const SearchOptions& o,
                               const ScreeningOptions& so, const SearchProgress& progress) {
  const NoiseRel sn = screening_noise(screen.backend(), so.window_s);
  const NoiseRel fn = screening_noise(full.backend(), so.full_window_s);
  SearchOptions screen_o = o;
  if (screen_o.noise_rel < 0 && !screen.backend().noise_rel()) {
    screen_o.noise_rel = sn.energy;
    if (screen_o.time_noise_rel < 0) screen_o.time_noise_rel = sn.time;
  }
  const int before = screen.measured();
  SearchResult r = strategy.run(p, space, screen, screen_o, progress);
  const int screened = screen.measured() - before;
  ScreenedSearch out = confirm_front(std::move(r), p, full, sn, fn, so);
  out.screen_measured = screened;
  return out;
}

}  // namespace kareus
