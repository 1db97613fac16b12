// XGBoost C API wrapper. The C boundary reports errors as -1 plus XGBGetLastError(); every call
// goes through check(), which turns that into a typed exception with XGBoost's message.
#include "kareus/surrogate.h"

#include <fmt/format.h>
#include <xgboost/c_api.h>

#include <cmath>
#include <mutex>
#include <random>
#include <utility>

#include "kareus/error.h"

namespace kareus {
namespace {

void check(int rc, const char* what) {
  if (rc != 0) throw InternalError(fmt::format("XGBoost {} failed: {}", what, XGBGetLastError()));
}

struct DMatrix {
  DMatrixHandle h = nullptr;
  explicit DMatrix(const Matrix& x) {
    check(XGDMatrixCreateFromMat(x.data.data(), x.rows, x.cols, NAN, &h), "DMatrixCreate");
  }
  ~DMatrix() {
    if (h) XGDMatrixFree(h);
  }
  DMatrix(const DMatrix&) = delete;
  DMatrix& operator=(const DMatrix&) = delete;
};

void quiet_xgboost() {
  static std::once_flag once;
  std::call_once(once, [] { XGBSetGlobalConfig(R"({"verbosity": 0})"); });
}

}  // namespace

struct XgbRegressor::Impl {
  XgbParams p;
  BoosterHandle booster = nullptr;
  ~Impl() {
    if (booster) XGBoosterFree(booster);
  }
};

XgbRegressor::XgbRegressor(XgbParams p) : impl_(std::make_unique<Impl>()) {
  impl_->p = std::move(p);
  quiet_xgboost();
}
XgbRegressor::~XgbRegressor() = default;
XgbRegressor::XgbRegressor(XgbRegressor&&) noexcept = default;
XgbRegressor& XgbRegressor::operator=(XgbRegressor&&) noexcept = default;

bool XgbRegressor::fitted() const { return impl_->booster != nullptr; }

void XgbRegressor::fit(const Matrix& x, const std::vector<float>& y) {
  if (x.rows == 0 || y.size() != x.rows) {
    throw InternalError(fmt::format("XgbRegressor::fit: {} rows, {} labels", x.rows, y.size()));
  }
  DMatrix d(x);
  check(XGDMatrixSetFloatInfo(d.h, "label", y.data(), y.size()), "SetFloatInfo");
  if (impl_->booster) {
    XGBoosterFree(impl_->booster);
    impl_->booster = nullptr;
  }
  check(XGBoosterCreate(&d.h, 1, &impl_->booster), "BoosterCreate");
  const auto& p = impl_->p;
  auto set = [&](const char* k, const std::string& v) {
    check(XGBoosterSetParam(impl_->booster, k, v.c_str()), k);
  };
  set("objective", "reg:squarederror");
  set("tree_method", "hist");
  set("max_depth", std::to_string(p.max_depth));
  set("eta", fmt::format("{}", p.eta));
  set("subsample", fmt::format("{}", p.subsample));
  set("colsample_bytree", fmt::format("{}", p.colsample_bytree));
  set("min_child_weight", fmt::format("{}", p.min_child_weight));
  set("lambda", fmt::format("{}", p.reg_lambda));
  if (!p.monotone_constraints.empty()) set("monotone_constraints", p.monotone_constraints);
  set("nthread", std::to_string(p.nthread));
  set("seed", std::to_string(p.seed % 2147483647ULL));
  set("verbosity", "0");
  for (int i = 0; i < p.rounds; ++i) {
    check(XGBoosterUpdateOneIter(impl_->booster, i, d.h), "UpdateOneIter");
  }
}

std::vector<float> XgbRegressor::predict(const Matrix& x) const {
  if (!impl_->booster) throw InternalError("XgbRegressor::predict before fit");
  DMatrix d(x);
  bst_ulong len = 0;
  const float* out = nullptr;
  check(XGBoosterPredict(impl_->booster, d.h, 0, 0, 0, &len, &out), "Predict");
  return std::vector<float>(out, out + len);
}

BootstrapEnsemble::BootstrapEnsemble(EnsembleParams p, std::uint64_t seed)
    : p_(std::move(p)), seed_(seed) {}

void BootstrapEnsemble::fit(const Matrix& x, const std::vector<float>& y) {
  members_.clear();
  std::mt19937_64 rng(seed_);
  const std::size_t n = std::max<std::size_t>(
      1,
      static_cast<std::size_t>(std::llround(p_.resample_fraction * static_cast<double>(x.rows))));
  std::uniform_int_distribution<std::size_t> pick(0, x.rows - 1);
  for (int m = 0; m < p_.members; ++m) {
    Matrix xs;
    xs.rows = n;
    xs.cols = x.cols;
    xs.data.reserve(n * x.cols);
    std::vector<float> ys;
    ys.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t r = pick(rng);
      xs.data.insert(xs.data.end(), x.row(r), x.row(r) + x.cols);
      ys.push_back(y[r]);
    }
    XgbParams xp = p_.xgb;
    xp.seed = seed_ * 31 + static_cast<std::uint64_t>(m);
    members_.emplace_back(xp);
    members_.back().fit(xs, ys);
  }
}

void BootstrapEnsemble::predict(const Matrix& x, std::vector<double>& mean,
                                std::vector<double>& stddev) const {
  mean.assign(x.rows, 0.0);
  stddev.assign(x.rows, 0.0);
  std::vector<double> sq(x.rows, 0.0);
  for (const auto& m : members_) {
    const auto p = m.predict(x);
    for (std::size_t i = 0; i < x.rows; ++i) {
      mean[i] += p[i];
      sq[i] += static_cast<double>(p[i]) * p[i];
    }
  }
  const double k = static_cast<double>(members_.size());
  for (std::size_t i = 0; i < x.rows; ++i) {
    mean[i] /= k;
    stddev[i] = std::sqrt(std::max(0.0, sq[i] / k - mean[i] * mean[i]));
  }
}

}  // namespace kareus
