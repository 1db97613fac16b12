#include <gtest/gtest.h>

#include <cmath>

#include "kareus/error.h"
#include "kareus/profiler.h"

namespace kareus {
namespace {

// The two measured window lengths come back exactly; others follow variance a + b / window with
// a = 1.1236e-4 - b / 5 and b = (2.56e-4 - 1.1236e-4) / 0.3 (hand-computed from docs/cuda.md).
TEST(NoiseAtWindow, ThroughTheMeasuredPoints) {
  const NoiseRel ref{0.001, 0.0106};
  EXPECT_EQ(noise_at_window(ref, kReferenceWindowS), ref);
  const NoiseRel two = noise_at_window(ref, 2.0);
  EXPECT_NEAR(two.energy, 0.0160, 1e-12);
  EXPECT_DOUBLE_EQ(two.time, 0.001);
  const double b = (2.56e-4 - 1.1236e-4) / 0.3, a = 1.1236e-4 - b / 5;
  EXPECT_NEAR(b, 4.788e-4, 1e-9);
  EXPECT_NEAR(noise_at_window(ref, 20.0).energy, std::sqrt(a + b / 20), 1e-12);
  EXPECT_NEAR(noise_at_window(ref, 1.0).energy, std::sqrt(a + b), 1e-12);
  // A scale, so an exact backend stays exact and twice the noise scales alike.
  EXPECT_EQ(noise_at_window({0, 0}, 2.0), (NoiseRel{0, 0}));
  EXPECT_NEAR(noise_at_window({0.002, 0.02}, 2.0).energy, 0.02 * 0.0160 / 0.0106, 1e-12);
  for (double bad : {0.0, -2.0, std::nan(""), double{INFINITY}}) {
    EXPECT_THROW(noise_at_window(ref, bad), InvalidInput) << bad;
  }
}

}  // namespace
}  // namespace kareus
