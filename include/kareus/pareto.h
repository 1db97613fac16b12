// Pareto utilities for two minimized objectives: non-dominated filtering, 2-D hypervolume and
// hypervolume improvement (Zitzler & Thiele, "Multiobjective optimization using evolutionary
// algorithms - a comparative case study", PPSN 1998).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace kareus {

struct Point2 {
  double x = 0, y = 0;
};

/// Indices of the non-dominated points (both objectives minimized), sorted by x ascending.
/// Of several identical points, the first index is kept.
std::vector<std::size_t> pareto_front(const std::vector<Point2>& pts);

/// The non-dominated elements of `v` on (time_s, dynamic_energy_j), time ascending: one rule
/// for partition options and instruction options alike.
template <typename T>
std::vector<T> pareto_by_time_and_energy(std::vector<T> v) {
  std::vector<Point2> pts;
  pts.reserve(v.size());
  for (const auto& o : v) pts.push_back({o.time_s, o.dynamic_energy_j});
  std::vector<T> out;
  for (std::size_t i : pareto_front(pts)) out.push_back(std::move(v[i]));
  return out;
}

/// Area dominated by `pts` and bounded by `ref` (points not strictly better than ref in both
/// objectives contribute nothing).
double hypervolume_2d(const std::vector<Point2>& pts, Point2 ref);

/// A front kept sorted for fast hypervolume-improvement queries.
class Front2 {
 public:
  Front2(const std::vector<Point2>& pts, Point2 ref);
  /// Hypervolume added if `p` joined the front (0 when dominated or outside ref).
  double improvement(Point2 p) const;
  void add(Point2 p);
  double hypervolume() const;
  const std::vector<Point2>& points() const { return front_; }

 private:
  std::vector<Point2> front_;  ///< non-dominated, x ascending, y descending
  Point2 ref_;
};

}  // namespace kareus
