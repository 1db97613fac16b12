// Pieces of mbo (src/search/strategies.cc) exposed for tests (internal).
#pragma once

#include <cstddef>
#include <vector>

#include "kareus/search.h"

namespace kareus {

/// Weights of the measurements m against the cross-fitted predictions `pred` of one objective
/// (see select_front): o.measurement_weight for every point, or with -1 the empirical-Bayes
/// weight (v_i + tau^2) / (v_i + tau^2 + s_i^2), where v_i = model_var[i], s_i^2 = noise_rel^2
/// x noise_var_scale[i] (1 where `noise_var_scale` is empty) and tau^2 = max(0, mean over
/// neighbouring pairs of `near_front` (in order along the front) of ((r_k - r_{k-1})^2 - v_k -
/// v_{k-1} - s_k^2 - s_{k-1}^2) / 2), r = log m - log pred.
std::vector<double> measurement_weights(const SearchOptions& o, double noise_rel,
                                        const std::vector<double>& m,
                                        const std::vector<double>& pred,
                                        const std::vector<double>& model_var,
                                        const std::vector<std::size_t>& near_front,
                                        const std::vector<double>& noise_var_scale = {});

/// XGBoost's lambda for the selection's residual trees of one objective: the empirical-Bayes
/// pseudo-count noise_var / (residual_var - noise_var), at least 1 (XGBoost's default) and at
/// most 999 (residuals within the noise); 1 when either variance is 0.
double leaf_shrinkage(double noise_var, double residual_var);

/// The Whittaker smoother (Eilers 2003) of per-position sums `sums` over `counts` points at the
/// ascending positions x: penalty on squared second divided differences scaled by the squared
/// mean step. With `hat_trace`, also the trace of the hat matrix (the smoother's degrees of
/// freedom, sum_i counts_i (A^-1)_ii); with `variance_factor`, each smoothed value's variance
/// per unit variance of one draw (sum_j (A^-1)_ij^2 counts_j).
std::vector<double> whittaker_smooth(const std::vector<double>& x, const std::vector<int>& counts,
                                     const std::vector<double>& sums, double penalty,
                                     double* hat_trace = nullptr,
                                     std::vector<double>* variance_factor = nullptr);

/// The clock effect of mbo's additive model: the Whittaker smoother (Eilers 2003) of the
/// per-clock residual sums `sums` over `counts` points, with `penalty` on squared second
/// divided differences scaled by the squared mean clock step; freqs_mhz ascending.
std::vector<double> whittaker_clock_effect(const std::vector<int>& freqs_mhz,
                                           const std::vector<int>& counts,
                                           const std::vector<double>& sums, double penalty);

/// mbo's two-way additive model of log y (clock effect + (SMs, slot) effect, AdditiveModel in
/// strategies.cc) fitted to log_y at `configs`, predicted at every configuration of `space`
/// in its index order (SearchSpace::at).
std::vector<double> additive_model_fit(const SearchSpace& space,
                                       const std::vector<PartitionConfig>& configs,
                                       const std::vector<double>& log_y, double clock_smoothing,
                                       double choice_pseudo_count);

}  // namespace kareus
