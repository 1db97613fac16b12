// 2-D Pareto front and hypervolume by a sort-and-sweep, O(n log n) (Kung, Luccio, Preparata,
// "On finding the maxima of a set of vectors", JACM 1975).
#include "kareus/pareto.h"

#include <algorithm>
#include <numeric>

namespace kareus {

std::vector<std::size_t> pareto_front(const std::vector<Point2>& pts) {
  std::vector<std::size_t> idx(pts.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
    return pts[a].x < pts[b].x || (pts[a].x == pts[b].x && pts[a].y < pts[b].y);
  });
  std::vector<std::size_t> out;
  double best_y = 0;
  for (std::size_t i : idx) {
    if (out.empty() || pts[i].y < best_y) {
      out.push_back(i);
      best_y = pts[i].y;
    }
  }
  return out;
}

double hypervolume_2d(const std::vector<Point2>& pts, Point2 ref) {
  std::vector<Point2> in;
  for (const auto& p : pts) {
    if (p.x < ref.x && p.y < ref.y) in.push_back(p);
  }
  double hv = 0, prev_y = ref.y;
  for (std::size_t i : pareto_front(in)) {
    hv += (ref.x - in[i].x) * (prev_y - in[i].y);
    prev_y = in[i].y;
  }
  return hv;
}

Front2::Front2(const std::vector<Point2>& pts, Point2 ref) : ref_(ref) {
  for (const auto& p : pts) add(p);
}

double Front2::improvement(Point2 p) const {
  if (!(p.x < ref_.x && p.y < ref_.y)) return 0.0;
  // front_ is x ascending, y descending. The new point's exclusive region is the part of
  // [p.x, ref.x) x [p.y, ref.y) not dominated by the front: a staircase sweep.
  auto it = std::lower_bound(front_.begin(), front_.end(), p.x,
                             [](const Point2& a, double x) { return a.x <= x; });
  // Points with x <= p.x: the last of them bounds y from above.
  double top = ref_.y;
  if (it != front_.begin()) top = std::prev(it)->y;
  if (p.y >= top) return 0.0;  // dominated (or equal)
  double gain = 0, x = p.x, y_cap = top;
  for (; it != front_.end() && it->y < y_cap; ++it) {
    gain += (it->x - x) * (y_cap - p.y);
    if (it->y <= p.y) {
      // The rest of the region is dominated by this point.
      return gain;
    }
    x = it->x;
    y_cap = it->y;
  }
  gain += (ref_.x - x) * (y_cap - p.y);
  return gain;
}

void Front2::add(Point2 p) {
  if (!(p.x < ref_.x && p.y < ref_.y)) return;
  if (improvement(p) <= 0.0) return;
  std::vector<Point2> next;
  next.reserve(front_.size() + 1);
  bool placed = false;
  for (const auto& q : front_) {
    if (p.x <= q.x && p.y <= q.y) continue;  // q dominated by p
    if (!placed && q.x > p.x) {
      next.push_back(p);
      placed = true;
    }
    next.push_back(q);
  }
  if (!placed) next.push_back(p);
  front_ = std::move(next);
}

double Front2::hypervolume() const { return hypervolume_2d(front_, ref_); }

}  // namespace kareus
