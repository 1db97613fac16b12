// Multi-fidelity profiling: a search screens every configuration it picks with a short
// measurement window, then re-measures with the full window only the configurations whose
// screened estimate may lie on the Pareto front, and recommends from those. On an H200 a 2 s
// window repeats energy to 1.6% against 1.06% at 5 s (docs/cuda.md), so screening costs 40% of
// the GPU time per point for 1.5x the noise, and the full window is spent where noise decides
// what is recommended. Successive halving (Jamieson & Talwalkar, AISTATS 2016) and
// multi-fidelity Bayesian optimization (Kandasamy et al., ICML 2017) spend cheap evaluations the
// same way: many at low fidelity, few at high fidelity near the optimum.
#pragma once

#include <cstddef>
#include <vector>

#include "kareus/profiler.h"
#include "kareus/search.h"
#include "kareus/store.h"

namespace kareus {

struct ScreeningOptions {
  double window_s = 2.0;    ///< screening window (the H200's shorter measured length)
  double cooldown_s = 2.0;  ///< cool-down after a screening point: the full one's 1:1 duty cycle
  /// The full window, for its noise where the backend does not know its own (real GPUs).
  double full_window_s = kReferenceWindowS;
  /// Confirm the configurations whose estimate is within `band` screening s.d. (of a log
  /// energy) of the estimated front: a miss of that size is within the screening noise.
  double band = 2.0;
  /// Confirm at most this share of the screened points (at least one), nearest the front first.
  double max_confirm_share = 0.25;
};

/// A screened search with its confirmations. `result` is the strategy's result on the screened
/// points (points[i].m the screening measurement) with, for every confirmed point, the estimate
/// replaced by the precision-weighted mean (in logs) of its screening and full measurements,
/// and `selected` the Pareto set on (time_s, energy_j) of the confirmed points' estimates.
struct ScreenedSearch {
  SearchResult result;
  std::vector<std::size_t> confirmed;  ///< indices into result.points, nearest the front first
  std::vector<Measurement> full;       ///< the full-window measurement of each confirmed point
  int screen_measured = 0;             ///< new screening measurements (not served by the store)
  int confirm_measured = 0;            ///< new full-window measurements
  NoiseRel screen_noise;               ///< the repeatabilities the confirmation weighed with
  NoiseRel full_noise;
};

/// The noise of a measurement by `backend` taken with `window_s` windows: the backend's own
/// (the emulator's, already at its window) or, where it does not know it (real GPUs), the
/// H200's kMeasuredNoiseRel at that window.
NoiseRel screening_noise(const Profiler& backend, double window_s);

/// The indices of `points` to confirm: every point whose estimate (`estimate_of(i)`) is behind
/// the estimated front by at most band x energy noise in the additive epsilon indicator of the
/// log objectives (Zitzler et al., IEEE TEC 2003), nearest first, at most
/// max(1, ceil(max_confirm_share x n)). Deterministic; ties keep the points' order.
std::vector<std::size_t> confirmation_candidates(const std::vector<Measurement>& estimates,
                                                 NoiseRel screen_noise, const ScreeningOptions& o);

/// Confirms `screened` (a search measured through the screening profiler): measures the
/// candidates through `full` in one batch and recommends from them (see ScreenedSearch).
ScreenedSearch confirm_front(SearchResult screened, const Partition& p, CachedProfiler& full,
                             NoiseRel screen_noise, NoiseRel full_noise, const ScreeningOptions& o);

/// `sc`'s points as one search measured at sc.full_noise, to be estimated together with
/// full-window points measured later (a plan's focus clocks): a confirmed point's measurement
/// becomes the precision-weighted mean of its two measurements, and every point's
/// SearchPoint::noise_var_scale its variance over the full window's (screening only: (screen /
/// full)^2; confirmed: 1 / (1 + (full / screen)^2)). Estimates and selection stay as they are.
SearchResult pooled_at_full_window(ScreenedSearch sc);

/// Runs `strategy` through `screen` (a backend created with the screening window) and confirms
/// through `full`. The strategy's noise assumption is the screening noise unless `o` sets one.
ScreenedSearch screened_search(SearchStrategy& strategy, const Partition& p,
                               const SearchSpace& space, CachedProfiler& screen,
                               CachedProfiler& full, const SearchOptions& o,
                               const ScreeningOptions& so, const SearchProgress& progress = {});

}  // namespace kareus
