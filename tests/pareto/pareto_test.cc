#include "kareus/pareto.h"

#include <gtest/gtest.h>

#include <random>

namespace kareus {
namespace {

TEST(Hypervolume, HandComputedCases) {
  // One point: a rectangle.
  EXPECT_DOUBLE_EQ(hypervolume_2d({{1, 2}}, {4, 5}), 3.0 * 3.0);
  // Staircase: (1,3), (2,2), (3,1) with ref (4,4): 3*1 + 2*1 + 1*1 ... computed column-wise:
  // x in [1,2): height 4-3=1; [2,3): 4-2=2; [3,4): 4-1=3 -> 1 + 2 + 3 = 6.
  EXPECT_DOUBLE_EQ(hypervolume_2d({{1, 3}, {2, 2}, {3, 1}}, {4, 4}), 6.0);
  // Dominated and duplicate points add nothing; points outside the reference are ignored.
  EXPECT_DOUBLE_EQ(hypervolume_2d({{1, 3}, {2, 2}, {3, 1}, {2.5, 2.5}, {2, 2}, {5, 0}}, {4, 4}),
                   6.0);
  EXPECT_DOUBLE_EQ(hypervolume_2d({}, {1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(hypervolume_2d({{1, 1}}, {1, 1}), 0.0);
}

bool dominates(Point2 a, Point2 b) { return a.x <= b.x && a.y <= b.y && (a.x < b.x || a.y < b.y); }

TEST(ParetoFront, MatchesBruteForceOnRandomSets) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> coord(0, 30);  // small grid: many ties and duplicates
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Point2> pts(1 + trial % 40);
    for (auto& p : pts) p = {static_cast<double>(coord(rng)), static_cast<double>(coord(rng))};
    std::vector<bool> expect(pts.size(), true);
    for (std::size_t i = 0; i < pts.size(); ++i) {
      for (std::size_t j = 0; j < pts.size(); ++j) {
        if (dominates(pts[j], pts[i])) expect[i] = false;
        // Of identical points only the first is kept.
        if (j < i && pts[j].x == pts[i].x && pts[j].y == pts[i].y) expect[i] = false;
      }
    }
    std::vector<bool> got(pts.size(), false);
    for (std::size_t i : pareto_front(pts)) got[i] = true;
    EXPECT_EQ(got, expect) << "trial " << trial;
  }
}

TEST(Front2, ImprovementEqualsHypervolumeDifference) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1.2);
  const Point2 ref{1.1, 1.1};
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Point2> pts(trial % 15);
    for (auto& p : pts) p = {u(rng), u(rng)};
    Front2 f(pts, ref);
    EXPECT_NEAR(f.hypervolume(), hypervolume_2d(pts, ref), 1e-12);
    for (int q = 0; q < 10; ++q) {
      const Point2 p{u(rng), u(rng)};
      auto with = pts;
      with.push_back(p);
      EXPECT_NEAR(f.improvement(p), hypervolume_2d(with, ref) - hypervolume_2d(pts, ref), 1e-12);
    }
  }
}

}  // namespace
}  // namespace kareus
