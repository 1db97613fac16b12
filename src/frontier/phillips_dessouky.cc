// Phillips-Dessouky time-cost trade-off (Phillips & Dessouky, Management Science 1977), the
// algorithm behind Perseus (Chung et al., SOSP '24) and its lowtime solver.
//
// The DAG (activity on node) becomes an activity-on-arc network. Starting with every activity
// at its slowest option, each iteration takes the critical sub-network (zero float), gives each
// critical arc a flow upper bound (energy added by shortening it one time unit; infinite when
// it cannot be shortened) and lower bound (energy saved by lengthening it one unit; 0 when it
// cannot), and finds a minimum cut by a maximum flow with lower bounds (Boost.Graph push-relabel,
// twice: once for a feasible flow, once to maximize it). Arcs crossing the cut forward are
// shortened by one unit, arcs crossing it backward lengthened, which shortens the project by one
// unit at the least energy.
//
// Where it is exact and where it is not:
// - Exact (for every integer deadline) on the convex relaxation: each activity's cost is the lower
//   convex envelope of its quantized discrete options, linear between envelope vertices. For
//   convex piecewise-linear costs the min-cut step is optimal (Phillips & Dessouky; Fulkerson,
//   Management Science 1961).
// - Heuristic in two places. (1) A duration between two envelope vertices is not a real option:
//   each recorded point snaps every activity to its slowest real option that fits its duration,
//   then hands slack back greedily (as-late-as-possible, slowest option that fits), and is
//   evaluated on those real options and real (unquantized) times. (2) Options above the convex
//   envelope are used only by the snapping and slack passes, never by the cut. The test
//   tests/frontier/frontier_test.cc compares the result with brute force on small DAGs.
#include <fmt/format.h>

#include <algorithm>
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/push_relabel_max_flow.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "kareus/error.h"
#include "kareus/frontier.h"
#include "kareus/pareto.h"

namespace kareus {
namespace {

// A flow network in compressed sparse row form, rebuilt for every cut from an edge list: one
// allocation per array instead of one per edge, and only the critical arcs' vertices.
struct FlowEdge {
  std::size_t id = 0;  ///< insertion order; edge 2k and 2k+1 are each other's reverse
};
using FlowGraph =
    boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, FlowEdge>;
using Edge = boost::graph_traits<FlowGraph>::edge_descriptor;

constexpr double kInf = 1e12;

// Capacities are integers (nano-joules): push-relabel's conservation checks and the feasibility
// test are exact, and no flow is lost to rounding. 1e12 J of "infinity" still fits in 64 bits.
constexpr double kUnitsPerJoule = 1e6;
using Units = std::int64_t;
inline Units to_units(double joules) {
  return static_cast<Units>(std::llround(std::min(joules, kInf) * kUnitsPerJoule));
}

class Flow {
 public:
  /// Adds u -> v with `cap` and its reverse with 0; returns the edge's id.
  std::size_t add(std::size_t u, std::size_t v, double cap_j) {
    const std::size_t id = ends_.size();
    ends_.push_back({u, v});
    ids_.push_back({id});
    caps_.push_back(to_units(std::max(0.0, cap_j)));
    ends_.push_back({v, u});
    ids_.push_back({id + 1});
    caps_.push_back(0);
    return id;
  }
  /// Capacity of edge `id` in units, as added.
  Units capacity(std::size_t id) const { return caps_[id]; }
  /// Builds the graph over vertices 0..n-1 and runs the maximum flow from s to t.
  Units max_flow(std::size_t n, std::size_t s, std::size_t t) {
    g_ = FlowGraph(boost::edges_are_unsorted_multi_pass, ends_.begin(), ends_.end(), ids_.begin(),
                   n);
    const auto eindex = boost::get(boost::edge_index, g_);
    const std::size_t m = ends_.size();
    at_.assign(m, 0);  // insertion id -> CSR edge index
    std::vector<Edge> by_index(m);
    for (auto [it, end] = boost::edges(g_); it != end; ++it) {
      at_[g_[*it].id] = (*it).idx;
      by_index[(*it).idx] = *it;
    }
    cap_.assign(m, 0);
    res_.assign(m, 0);
    rev_.assign(m, Edge());
    for (std::size_t k = 0; k < m; ++k) {
      cap_[at_[k]] = caps_[k];
      rev_[at_[k]] = by_index[at_[k ^ 1]];
    }
    const auto vindex = boost::get(boost::vertex_index, g_);
    return boost::push_relabel_max_flow(
        g_, s, t, boost::make_iterator_property_map(cap_.begin(), eindex),
        boost::make_iterator_property_map(res_.begin(), eindex),
        boost::make_iterator_property_map(rev_.begin(), eindex), vindex);
  }
  double flow(std::size_t id) const {
    return static_cast<double>(cap_[at_[id]] - res_[at_[id]]) / kUnitsPerJoule;
  }
  /// Vertices reachable from s through edges with residual capacity (after max_flow).
  std::vector<bool> reachable(std::size_t s) const {
    std::vector<bool> seen(boost::num_vertices(g_), false);
    std::vector<std::size_t> stack = {s};
    seen[s] = true;
    while (!stack.empty()) {
      const std::size_t u = stack.back();
      stack.pop_back();
      for (auto [it, end] = boost::out_edges(u, g_); it != end; ++it) {
        const std::size_t v = boost::target(*it, g_);
        if (!seen[v] && res_[(*it).idx] > 0) {
          seen[v] = true;
          stack.push_back(v);
        }
      }
    }
    return seen;
  }

 private:
  std::vector<std::pair<std::size_t, std::size_t>> ends_;
  std::vector<FlowEdge> ids_;
  std::vector<Units> caps_, cap_, res_;
  std::vector<std::size_t> at_;
  FlowGraph g_;
  std::vector<Edge> rev_;
};

// An activity's quantized options and the convex envelope of its cost.
struct Activity {
  std::vector<long> q;       ///< quantized duration of each real option
  std::vector<long> hull_d;  ///< envelope vertices (ascending durations)
  std::vector<double> hull_e;
  long dmin = 0, dmax = 0;

  double cost(long d) const {
    if (hull_d.size() == 1) return hull_e[0];
    auto it = std::upper_bound(hull_d.begin(), hull_d.end(), d);
    if (it == hull_d.begin()) return hull_e.front();
    if (it == hull_d.end()) return hull_e.back();
    const std::size_t j = static_cast<std::size_t>(it - hull_d.begin());
    const double w =
        static_cast<double>(d - hull_d[j - 1]) / static_cast<double>(hull_d[j] - hull_d[j - 1]);
    return hull_e[j - 1] + w * (hull_e[j] - hull_e[j - 1]);
  }
  // The options' Pareto staircase: time ascending, energy strictly descending. The cheapest
  // option within a time budget is then the last staircase step that fits (binary search).
  std::vector<int> stair;
  std::vector<long> stair_q;
  std::vector<double> stair_t;

  /// The cheapest real option whose quantized duration fits in d (the fastest if none fits).
  int snap(long d) const {
    const auto it = std::upper_bound(stair_q.begin(), stair_q.end(), d);
    return stair[it == stair_q.begin() ? 0 : static_cast<std::size_t>(it - stair_q.begin()) - 1];
  }
  /// The cheapest real option that takes at most `budget_s` (-1 if none does).
  int cheapest_within(double budget_s) const {
    const auto it = std::upper_bound(stair_t.begin(), stair_t.end(), budget_s);
    return it == stair_t.begin() ? -1 : stair[static_cast<std::size_t>(it - stair_t.begin()) - 1];
  }
};

Activity make_activity(const DagNode& n, double unit) {
  Activity a;
  // Merge options that quantize to the same duration (keep the cheaper).
  std::vector<std::pair<long, double>> pts;
  for (const auto& o : n.options) pts.push_back({std::lround(o.time_s / unit), o.energy_j});
  for (const auto& pt : pts) a.q.push_back(pt.first);
  std::vector<int> order(n.options.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int>(j);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    const auto& ox = n.options[static_cast<std::size_t>(x)];
    const auto& oy = n.options[static_cast<std::size_t>(y)];
    return ox.time_s < oy.time_s || (ox.time_s == oy.time_s && ox.energy_j < oy.energy_j);
  });
  for (int j : order) {
    const auto& o = n.options[static_cast<std::size_t>(j)];
    if (!a.stair.empty() &&
        o.energy_j >= n.options[static_cast<std::size_t>(a.stair.back())].energy_j)
      continue;
    a.stair.push_back(j);
    a.stair_q.push_back(a.q[static_cast<std::size_t>(j)]);
    a.stair_t.push_back(o.time_s);
  }
  std::vector<std::pair<long, double>> merged;
  std::sort(pts.begin(), pts.end());
  for (const auto& p : pts) {
    if (!merged.empty() && merged.back().first == p.first) {
      merged.back().second = std::min(merged.back().second, p.second);
    } else {
      merged.push_back(p);
    }
  }
  // Lower convex hull (Andrew's monotone chain).
  std::vector<std::pair<long, double>> h;
  for (const auto& p : merged) {
    while (h.size() >= 2) {
      const auto& o = h[h.size() - 2];
      const auto& m = h.back();
      const double cross = static_cast<double>(m.first - o.first) * (p.second - o.second) -
                           (m.second - o.second) * static_cast<double>(p.first - o.first);
      if (cross <= 0) {
        h.pop_back();
      } else {
        break;
      }
    }
    h.push_back(p);
  }
  // Past the cheapest point a slower duration never helps: the envelope ends there.
  std::size_t cheapest = 0;
  for (std::size_t j = 0; j < h.size(); ++j) {
    if (h[j].second < h[cheapest].second) cheapest = j;
  }
  h.resize(cheapest + 1);
  for (const auto& [d, e] : h) {
    a.hull_d.push_back(d);
    a.hull_e.push_back(e);
  }
  a.dmin = a.hull_d.front();
  a.dmax = a.hull_d.back();
  return a;
}

struct Arc {
  std::size_t u, v;
  int activity;  ///< node id, or -1 for a dummy arc
};

}  // namespace

std::vector<FrontierPoint> pareto_frontier(const std::vector<FrontierPoint>& points) {
  std::vector<Point2> pts;
  for (const auto& p : points) pts.push_back({p.time_s, p.energy_j});
  std::vector<FrontierPoint> front;
  for (std::size_t i : pareto_front(pts)) front.push_back(points[i]);
  return front;
}

std::vector<FrontierPoint> solve_frontier(const IterationDag& dag, const FrontierOptions& o,
                                          FrontierStats* stats) {
  const auto t_start = std::chrono::steady_clock::now();
  if (!(o.unit_s > 0)) throw InvalidInput(fmt::format("--unit must be > 0, got {}", o.unit_s));
  const std::size_t n = dag.nodes.size();
  if (n == 0) return {};
  for (const auto& node : dag.nodes) {
    if (node.options.empty()) {
      throw InternalError(fmt::format("DAG node {} has no options", node.id));
    }
  }
  const auto topo = dag.topological_order();
  std::vector<Activity> act;
  act.reserve(n);
  for (const auto& node : dag.nodes) act.push_back(make_activity(node, o.unit_s));

  // Activity-on-arc network: 0 = source, 1 = sink, node i -> (2+2i) -> (3+2i).
  const std::size_t V = 2 + 2 * n;
  auto in = [](std::size_t i) { return 2 + 2 * i; };
  auto out = [](std::size_t i) { return 3 + 2 * i; };
  std::vector<Arc> arcs;
  std::vector<int> indeg(n, 0), outdeg(n, 0);
  for (const auto& [a, b] : dag.edges) {
    ++outdeg[static_cast<std::size_t>(a)];
    ++indeg[static_cast<std::size_t>(b)];
    arcs.push_back({out(static_cast<std::size_t>(a)), in(static_cast<std::size_t>(b)), -1});
  }
  for (std::size_t i = 0; i < n; ++i) {
    arcs.push_back({in(i), out(i), static_cast<int>(i)});
    if (indeg[i] == 0) arcs.push_back({0, in(i), -1});
    if (outdeg[i] == 0) arcs.push_back({out(i), 1, -1});
  }
  // Topological order of AOA vertices and out-arc lists.
  std::vector<std::size_t> vorder = {0};
  for (int u : topo) {
    vorder.push_back(in(static_cast<std::size_t>(u)));
    vorder.push_back(out(static_cast<std::size_t>(u)));
  }
  vorder.push_back(1);
  std::vector<std::vector<std::size_t>> out_arcs(V);
  for (std::size_t k = 0; k < arcs.size(); ++k) out_arcs[arcs[k].u].push_back(k);

  std::vector<long> d(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = act[i].dmax;
  auto dur = [&](const Arc& a) {
    return a.activity < 0 ? 0L : d[static_cast<std::size_t>(a.activity)];
  };
  std::vector<long> E(V), L(V);
  auto schedule = [&] {
    std::fill(E.begin(), E.end(), 0L);
    for (std::size_t u : vorder) {
      for (std::size_t k : out_arcs[u]) E[arcs[k].v] = std::max(E[arcs[k].v], E[u] + dur(arcs[k]));
    }
    const long T = E[1];
    std::fill(L.begin(), L.end(), T);
    for (auto it = vorder.rbegin(); it != vorder.rend(); ++it) {
      for (std::size_t k : out_arcs[*it]) L[*it] = std::min(L[*it], L[arcs[k].v] - dur(arcs[k]));
    }
    return T;
  };

  // Real options for quantized durations, then slack handed back as-late-as-possible.
  std::vector<std::vector<int>> pred(n), succ(n);
  for (const auto& [a, b] : dag.edges) {
    succ[static_cast<std::size_t>(a)].push_back(b);
    pred[static_cast<std::size_t>(b)].push_back(a);
  }
  std::vector<FrontierPoint> points;
  // Hands slack back: as-late-as-possible, each activity (reverse topological order) takes its
  // cheapest option that still finishes by its successors' start and by `limit`.
  std::vector<double> es(n), ls(n), fin(n);
  auto refine = [&](std::vector<int> choice, double limit) {
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      const auto i = static_cast<std::size_t>(*it);
      double lf = limit;
      for (int s : succ[i]) lf = std::min(lf, ls[static_cast<std::size_t>(s)]);
      const auto& opts = dag.nodes[i].options;
      int c = choice[i];
      const int j = act[i].cheapest_within(lf * (1 + 1e-12) - es[i]);
      if (j >= 0 &&
          opts[static_cast<std::size_t>(j)].energy_j < opts[static_cast<std::size_t>(c)].energy_j)
        c = j;
      choice[i] = c;
      ls[i] = lf - opts[static_cast<std::size_t>(c)].time_s;
    }
    FrontierPoint p;
    p.choice = std::move(choice);
    for (int u : topo) {  // the makespan of the final choice
      const auto i = static_cast<std::size_t>(u);
      double start = 0;
      for (int q : pred[i]) start = std::max(start, fin[static_cast<std::size_t>(q)]);
      fin[i] = start + dag.nodes[i].options[static_cast<std::size_t>(p.choice[i])].time_s;
      p.time_s = std::max(p.time_s, fin[i]);
    }
    for (std::size_t i = 0; i < n; ++i) {
      p.dynamic_energy_j += dag.nodes[i].options[static_cast<std::size_t>(p.choice[i])].energy_j;
    }
    p.energy_j = p.dynamic_energy_j + dag.gpus * dag.static_power_w * p.time_s;
    points.push_back(std::move(p));
  };
  // Real options for the quantized durations: snap, then refine twice, within the snapped
  // makespan and within the solver's current deadline T (the snap can leave time unused).
  // `fastest`: every activity at its fastest real option instead of the snapped durations, so
  // that the frontier's fast end is exact even when options share a quantized duration.
  auto record = [&](long T_units, bool fastest = false) {
    std::vector<int> choice(n);
    for (std::size_t i = 0; i < n; ++i)
      choice[i] = fastest ? act[i].stair.front() : act[i].snap(d[i]);
    double M = 0;
    for (int u : topo) {
      const auto i = static_cast<std::size_t>(u);
      es[i] = 0;
      for (int p : pred[i]) {
        const auto pi = static_cast<std::size_t>(p);
        es[i] = std::max(
            es[i], es[pi] + dag.nodes[pi].options[static_cast<std::size_t>(choice[pi])].time_s);
      }
      M = std::max(M, es[i] + dag.nodes[i].options[static_cast<std::size_t>(choice[i])].time_s);
    }
    refine(choice, M);
    const double target = static_cast<double>(T_units) * o.unit_s;
    if (target > M) refine(choice, target);
  };

  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> local(V, kNone);
  long T = schedule();
  record(T);
  int iterations = 0;
  int stats_no_credit = 0;
  while (true) {
    ++iterations;
    // Critical arcs and their flow bounds.
    std::vector<std::size_t> crit;
    std::vector<double> lb, ub;
    for (std::size_t k = 0; k < arcs.size(); ++k) {
      const Arc& a = arcs[k];
      if (E[a.u] != L[a.u] || E[a.u] + dur(a) != L[a.v]) continue;
      double l = 0, u = kInf;
      if (a.activity >= 0) {
        const auto i = static_cast<std::size_t>(a.activity);
        const Activity& x = act[i];
        if (d[i] > x.dmin) u = std::max(0.0, x.cost(d[i] - 1) - x.cost(d[i]));
        if (d[i] < x.dmax) l = std::max(0.0, x.cost(d[i]) - x.cost(d[i] + 1));
        l = std::min(l, u);
      }
      crit.push_back(k);
      lb.push_back(l);
      ub.push_back(u);
    }
    // 1) A feasible flow: capacities ub - lb, lower bounds moved to a super source and sink.
    // With quantized costs the lower bounds can be infeasible (the current durations are then
    // not optimal for this T); the cut is then taken without lengthening credits (lb = 0), which
    // is always feasible.
    // Only the critical arcs' vertices enter the flow networks (compact ids).
    std::fill(local.begin(), local.end(), kNone);
    std::vector<std::size_t> global;
    auto id = [&](std::size_t v) {
      if (local[v] == kNone) {
        local[v] = global.size();
        global.push_back(v);
      }
      return local[v];
    };
    id(0);
    id(1);
    std::vector<std::pair<std::size_t, std::size_t>> cu(crit.size());
    for (std::size_t c = 0; c < crit.size(); ++c)
      cu[c] = {id(arcs[crit[c]].u), id(arcs[crit[c]].v)};
    const std::size_t W = global.size();
    auto min_cut = [&](bool with_lb) -> std::optional<std::vector<bool>> {
      Flow f1;
      std::vector<double> excess(W, 0.0);
      std::vector<std::size_t> e1(crit.size());
      double need = 0;
      for (std::size_t c = 0; c < crit.size(); ++c) {
        const auto [u, v] = cu[c];
        const double l = with_lb ? lb[c] : 0.0;
        e1[c] = f1.add(u, v, ub[c] - l);
        excess[v] += l;
        excess[u] -= l;
      }
      Units need_units = 0;
      for (std::size_t v = 0; v < W; ++v) {
        if (excess[v] > 0) {
          need_units += f1.capacity(f1.add(W, v, excess[v]));
          need += excess[v];
        } else if (excess[v] < 0) {
          f1.add(v, W + 1, -excess[v]);
        }
      }
      f1.add(1, 0, kInf);
      std::vector<double> flow(crit.size(), 0.0);
      if (need > 0) {
        // Lower bounds move to the super source and sink with rounding on both sides; a unit
        // per vertex of slack absorbs it.
        const Units slack = static_cast<Units>(W);
        if (f1.max_flow(W + 2, W, W + 1) < need_units - slack) return std::nullopt;
        for (std::size_t c = 0; c < crit.size(); ++c) flow[c] = f1.flow(e1[c]);
      }
      // 2) Maximize it from source to sink in the residual network of the feasible flow.
      Flow f2;
      for (std::size_t c = 0; c < crit.size(); ++c) {
        const auto [u, v] = cu[c];
        const double l = with_lb ? lb[c] : 0.0;
        const double fl = flow[c] + l;
        f2.add(u, v, std::max(0.0, ub[c] - fl));
        f2.add(v, u, std::max(0.0, fl - l));
      }
      f2.max_flow(W, 0, 1);
      const std::vector<bool> reach = f2.reachable(0);
      std::vector<bool> side(V, false);
      for (std::size_t k = 0; k < W; ++k) side[global[k]] = reach[k];
      return side;
    };
    auto cut_sets = min_cut(true);
    const bool credits = cut_sets.has_value();
    if (!cut_sets) cut_sets = min_cut(false);
    if (!credits) ++stats_no_credit;
    const std::vector<bool>& S = *cut_sets;
    if (S[1]) break;  // infinite capacity path: the project cannot get shorter
    std::vector<std::size_t> faster, slower;
    bool blocked = false;
    double cut = 0;
    for (std::size_t c = 0; c < crit.size(); ++c) {
      const Arc& a = arcs[crit[c]];
      if (S[a.u] && !S[a.v]) {
        if (a.activity < 0 || d[static_cast<std::size_t>(a.activity)] <=
                                  act[static_cast<std::size_t>(a.activity)].dmin) {
          blocked = true;
          break;
        }
        faster.push_back(static_cast<std::size_t>(a.activity));
        cut += ub[c];
      } else if (!S[a.u] && S[a.v] && a.activity >= 0) {
        slower.push_back(static_cast<std::size_t>(a.activity));
        if (credits) cut -= lb[c];
      }
    }
    if (blocked || faster.empty() || cut >= kInf / 2) break;
    for (std::size_t i : faster) --d[i];
    std::vector<std::size_t> lengthened;
    for (std::size_t i : slower) {
      if (d[i] < act[i].dmax) {
        ++d[i];
        lengthened.push_back(i);
      }
    }
    long T2 = schedule();
    if (T2 > T - 1) {
      // A lengthened arc made a non-critical path too long: keep only the shortenings.
      for (std::size_t i : lengthened) --d[i];
      T2 = schedule();
    }
    if (T2 >= T) break;
    T = T2;
    record(T);
  }

  record(0, true);

  std::vector<FrontierPoint> front = pareto_frontier(points);
  if (stats) {
    stats->iterations = iterations;
    stats->cuts_without_credit = stats_no_credit;
    stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  }
  return front;
}

}  // namespace kareus
