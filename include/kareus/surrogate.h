// Surrogate models for the search: gradient-boosted trees through the XGBoost C API (Chen &
// Guestrin, KDD '16), with RAII handles and every return code checked, and a bootstrap
// ensemble whose spread estimates the model's uncertainty.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kareus {

/// Row-major feature matrix.
struct Matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<float> data;
  const float* row(std::size_t r) const { return data.data() + r * cols; }
};

struct XgbParams {
  int max_depth = 6;  ///< Kareus artifact settings
  double eta = 0.3;
  double subsample = 0.8;
  double colsample_bytree = 0.8;
  int rounds = 100;
  double min_child_weight = 1;  ///< XGBoost's default; larger values smooth noisy targets
  /// XGBoost's lambda: L2 penalty on leaf weights, a pseudo-count of zero-residual points in
  /// every leaf (1 is XGBoost's default).
  double reg_lambda = 1;
  /// XGBoost's monotone_constraints, e.g. "(-1,0,0)": -1 makes the prediction non-increasing
  /// in that feature. Empty: none.
  std::string monotone_constraints;
  int nthread = 1;  ///< one thread: deterministic, and searches can run in parallel
  std::uint64_t seed = 0;
};

/// One XGBoost regressor (reg:squarederror). Errors from the library throw InternalError with
/// XGBoost's message.
class XgbRegressor {
 public:
  explicit XgbRegressor(XgbParams p = {});
  ~XgbRegressor();
  XgbRegressor(XgbRegressor&&) noexcept;
  XgbRegressor& operator=(XgbRegressor&&) noexcept;
  void fit(const Matrix& x, const std::vector<float>& y);
  std::vector<float> predict(const Matrix& x) const;
  bool fitted() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct EnsembleParams {
  int members = 5;
  double resample_fraction = 0.8;  ///< each member trains on this share, drawn with replacement
  XgbParams xgb;
};

/// Bootstrap ensemble: members trained on seeded resamples. mean = average of members,
/// stddev = their standard deviation.
class BootstrapEnsemble {
 public:
  BootstrapEnsemble(EnsembleParams p, std::uint64_t seed);
  void fit(const Matrix& x, const std::vector<float>& y);
  void predict(const Matrix& x, std::vector<double>& mean, std::vector<double>& stddev) const;

 private:
  EnsembleParams p_;
  std::uint64_t seed_;
  std::vector<XgbRegressor> members_;
};

}  // namespace kareus
