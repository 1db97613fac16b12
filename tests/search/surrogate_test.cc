#include "kareus/surrogate.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kareus {
namespace {

// A known regression: y = 3 a + 2 b on a 20 x 20 grid. Boosted trees with 100 rounds of depth 6
// and eta 0.3 fit the training grid closely, and the ensemble's mean stays close too.
Matrix grid(std::vector<float>& y) {
  Matrix x;
  x.cols = 2;
  for (int a = 0; a < 20; ++a) {
    for (int b = 0; b < 20; ++b) {
      x.data.push_back(static_cast<float>(a));
      x.data.push_back(static_cast<float>(b));
      y.push_back(3.0f * a + 2.0f * b);
      ++x.rows;
    }
  }
  return x;
}

TEST(XgbRegressor, FitsALinearFunction) {
  std::vector<float> y;
  const Matrix x = grid(y);
  XgbParams p;
  p.subsample = 1.0;
  p.colsample_bytree = 1.0;
  XgbRegressor r(p);
  EXPECT_FALSE(r.fitted());
  r.fit(x, y);
  const auto pred = r.predict(x);
  ASSERT_EQ(pred.size(), y.size());
  double max_err = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    max_err = std::max(max_err, std::abs(double(pred[i]) - y[i]));
  EXPECT_LT(max_err, 1.0);  // range 0..95
}

// One feature 0..n-1 and a step target: `low` below n / 2, `high` from there.
Matrix step(int n, float low, float high, std::vector<float>& y) {
  Matrix x;
  x.cols = 1;
  for (int i = 0; i < n; ++i) {
    x.data.push_back(static_cast<float>(i));
    y.push_back(i < n / 2 ? low : high);
    ++x.rows;
  }
  return x;
}

TEST(XgbRegressor, StepFunctionIsExactBetweenLevels) {
  std::vector<float> y;
  const Matrix x = step(100, 1.0f, 5.0f, y);
  XgbParams p;
  p.subsample = 1.0;
  p.colsample_bytree = 1.0;
  XgbRegressor r(p);
  r.fit(x, y);
  const auto pred = r.predict(x);
  EXPECT_NEAR(pred[10], 1.0, 1e-3);
  EXPECT_NEAR(pred[90], 5.0, 1e-3);
}

// lambda reaches XGBoost: one stump on two groups of 4 points (targets +1 and -1) moves each
// group's prediction by its mean residual x 4 / (4 + lambda), whatever the base score, so the
// two predictions differ by 2 x 4 / (4 + lambda).
TEST(XgbRegressor, RegLambdaShrinksEachLeaf) {
  std::vector<float> y;
  const Matrix x = step(8, 1.0f, -1.0f, y);
  for (double lambda : {1.0, 4.0, 12.0}) {
    XgbParams p;
    p.subsample = 1.0;
    p.colsample_bytree = 1.0;
    p.max_depth = 1;
    p.eta = 1.0;
    p.rounds = 1;
    p.reg_lambda = lambda;
    XgbRegressor r(p);
    r.fit(x, y);
    const auto pred = r.predict(x);
    EXPECT_NEAR(pred[0] - pred[7], 8.0 / (4.0 + lambda), 1e-5) << "lambda " << lambda;
  }
}

TEST(BootstrapEnsemble, DeterministicBySeedAndUncertaintyIsPositive) {
  std::vector<float> y;
  const Matrix x = grid(y);
  BootstrapEnsemble a({}, 3), b({}, 3), c({}, 4);
  a.fit(x, y);
  b.fit(x, y);
  c.fit(x, y);
  std::vector<double> ma, sa, mb, sb, mc, sc;
  a.predict(x, ma, sa);
  b.predict(x, mb, sb);
  c.predict(x, mc, sc);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(ma, mc);
  double mean_sd = 0, max_err = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    mean_sd += sa[i] / static_cast<double>(y.size());
    max_err = std::max(max_err, std::abs(ma[i] - y[i]));
  }
  EXPECT_GT(mean_sd, 0.0);
  EXPECT_LT(max_err, 8.0);
}

}  // namespace
}  // namespace kareus
