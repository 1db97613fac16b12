// Phillips-Dessouky time-cost trade-off (Phillips & Dessouky, Management Science 1977), the
// algorithm behind Perseus (Chung et al., SOSP '24) and its lowtime solver.
//
// The DAG (activity on node) becomes an activity-on-arc network. Starting with every activity
// at its slowest option, each iteration takes the critical sub-network (zero float), gives each
// critical arc a flow upper bound (energy added by shortening it one time unit; infinite when
// it cannot be shortened) and lower bound (energy saved by lengthening it one unit; 0 when it
// cannot), and finds a minimum cut by a maximum flow with lower bounds (twice: once for a
// feasible flow, once to maximize it). Arcs crossing the cut forward are shortened by one unit,
// arcs crossing it backward lengthened, which shortens the project by one unit at the least
// energy.
//
// Cost per iteration. Every step is linear in the network except the maximum flow: the
// schedule, the critical arcs and the recorded point are passes over arrays allocated once, the
// flow network is a compressed-sparse-row graph rebuilt in place, and the maximum flow is
// Dinic's algorithm (Dinic, Soviet Math. Doklady 1970) on it; on these networks (few disjoint
// cheap paths, long critical chains) it needs a handful of phases, each a linear BFS and DFS.
// The passes are kept cache-friendly: nodes are renumbered in topological order (the caller's
// numbering returns only in the recorded choices), event times are computed on the nodes'
// predecessor and successor rows, the arcs are sorted by tail so that the critical scan skips
// every node with float, and the flow network keeps heads, reverse arcs and residuals in CSR
// order. A recorded point whose snapped options did not change since the previous one skips the
// first slack pass (it would give the point already archived).
// The cut is the set of vertices reachable from the source in the residual network of a
// maximum flow, which is the same for every maximum flow (the minimal minimum cut), so the
// frontier does not depend on the flow algorithm. A network identical to the previous
// iteration's (same critical arcs, same bounds) has the same cut, which is reused. Recorded
// points go into a running Pareto archive, so memory stays at the frontier's size instead of
// one choice vector per iteration.
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
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>

#include "kareus/error.h"
#include "kareus/frontier.h"
#include "kareus/pareto.h"

namespace kareus {
namespace {

constexpr double kInf = 1e12;

// Capacities are integers (micro-joules): conservation and the feasibility test are exact, and
// no flow is lost to rounding.
constexpr double kUnitsPerJoule = 1e6;
using Units = std::int64_t;
// "Infinite" capacity (17.6 MJ per time unit): larger than any finite cut (sums of per-unit
// energies), small enough that a flow of half a million such augmentations fits in 64 bits.
constexpr Units kInfUnits = Units{1} << 44;
inline Units to_units(double joules) {
  return static_cast<Units>(std::llround(std::clamp(joules, 0.0, kInf) * kUnitsPerJoule));
}

// The solver refuses units that would need more iterations than this (each iteration shortens
// the makespan by at least one unit): a too fine --unit would otherwise run for hours.
constexpr long kMaxIterations = 200000;

// Maximum flow by Dinic's algorithm on a compressed-sparse-row residual graph. Arc 2k is the
// k-th added arc and 2k+1 its reverse; a pair carries the residual capacities of both
// directions, so an arc whose flow may also decrease (down to its lower bound) is one pair. The
// residual capacities, heads and reverse arcs are stored in CSR order, so that a breadth-first
// pass reads each vertex's arcs contiguously. All storage is kept between networks.
class MaxFlow {
 public:
  void reset(std::size_t vertices) {
    n_ = static_cast<Index>(vertices);
    from_.clear();
    to_.clear();
    cap_.clear();
  }
  /// Adds u -> v with residual capacity `cap` and v -> u with `back`; returns the arc's id.
  std::size_t add(std::size_t u, std::size_t v, Units cap, Units back = 0) {
    const std::size_t id = from_.size();
    from_.insert(from_.end(), {static_cast<Index>(u), static_cast<Index>(v)});
    to_.insert(to_.end(), {static_cast<Index>(v), static_cast<Index>(u)});
    cap_.insert(cap_.end(), {std::max<Units>(0, cap), std::max<Units>(0, back)});
    return id;
  }
  /// Net flow added from u to v on arc `id` (negative: flow taken back).
  Units flow(std::size_t id) const { return cap_[id] - res_[pos_[id]]; }

  /// The maximum flow from s to t, or a value >= kInfUnits / 2 as soon as it reaches that.
  Units run(std::size_t s, std::size_t t) {
    build_csr();
    const auto si = static_cast<Index>(s), ti = static_cast<Index>(t);
    Units total = 0;
    while (total < kInfUnits / 2 && levels(si, ti)) {
      cur_.assign(first_.begin(), first_.end() - 1);
      while (total < kInfUnits / 2) {
        const Units f = augment(si, ti, kInfUnits);
        if (f == 0) break;
        total += f;
      }
    }
    return total;
  }
  /// Whether v is reachable from s through arcs with residual capacity, after a run() that
  /// returned a finite flow: its last BFS, the one that no longer reached t, marked them.
  bool reachable(std::size_t v) const { return level_[v] >= 0; }

 private:
  using Index = std::uint32_t;
  void build_csr() {
    const std::size_t m = from_.size();
    first_.assign(static_cast<std::size_t>(n_) + 1, 0);
    for (Index u : from_) ++first_[u + 1];
    for (Index v = 0; v < n_; ++v) first_[v + 1] += first_[v];
    cur_.assign(first_.begin(), first_.end() - 1);
    pos_.resize(m);
    for (std::size_t a = 0; a < m; ++a) pos_[a] = cur_[from_[a]]++;
    head_.resize(m);
    rev_.resize(m);
    res_.resize(m);
    for (std::size_t a = 0; a < m; ++a) {
      head_[pos_[a]] = to_[a];
      rev_[pos_[a]] = pos_[a ^ 1];
      res_[pos_[a]] = cap_[a];
    }
  }
  // BFS levels from s over residual arcs; false when t is unreachable.
  bool levels(Index s, Index t) {
    level_.assign(n_, -1);
    level_[s] = 0;
    queue_.assign(1, s);
    for (std::size_t h = 0; h < queue_.size() && level_[t] < 0; ++h) {
      const Index u = queue_[h];
      const int next = level_[u] + 1;
      for (Index k = first_[u]; k < first_[u + 1]; ++k) {
        const Index v = head_[k];
        if (res_[k] > 0 && level_[v] < 0) {
          level_[v] = next;
          queue_.push_back(v);
        }
      }
    }
    return level_[t] >= 0;
  }
  // One augmenting path in the level graph (depth-first with current-arc pointers, so every
  // arc is skipped at most once per phase); returns the flow pushed along it.
  Units augment(Index u, Index t, Units limit) {
    if (u == t) return limit;
    for (Index& k = cur_[u]; k < first_[u + 1]; ++k) {
      const Index v = head_[k];
      if (res_[k] <= 0 || level_[v] != level_[u] + 1) continue;
      if (const Units f = augment(v, t, std::min(limit, res_[k]))) {
        res_[k] -= f;
        res_[rev_[k]] += f;
        return f;
      }
    }
    return 0;
  }

  Index n_ = 0;
  // In insertion order: tails, heads and capacities of the arcs, each one's CSR position.
  std::vector<Index> from_, to_, pos_;
  std::vector<Units> cap_;
  // In CSR order: heads, reverse arcs, residual capacities.
  std::vector<Index> first_, cur_, queue_, head_, rev_;
  std::vector<Units> res_;
  std::vector<int> level_;
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

  /// The staircase step of the cheapest real option whose quantized duration fits in d (the
  /// fastest if none fits).
  std::size_t snap_step(long d) const {
    const auto it = std::upper_bound(stair_q.begin(), stair_q.end(), d);
    return it == stair_q.begin() ? 0 : static_cast<std::size_t>(it - stair_q.begin()) - 1;
  }
};

void build_staircase(const DagNode& n, Activity& a) {
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
}

// Lower convex hull (Andrew's monotone chain) of the quantized options, cut at the cheapest
// vertex: past it a slower duration never helps.
void build_envelope(std::vector<std::pair<long, double>> pts, Activity& a) {
  std::vector<std::pair<long, double>> merged;  // one point per duration (the cheaper)
  std::sort(pts.begin(), pts.end());
  for (const auto& p : pts) {
    if (!merged.empty() && merged.back().first == p.first) {
      merged.back().second = std::min(merged.back().second, p.second);
    } else {
      merged.push_back(p);
    }
  }
  std::vector<std::pair<long, double>> h;
  for (const auto& p : merged) {
    while (h.size() >= 2) {
      const auto& o = h[h.size() - 2];
      const auto& m = h.back();
      const double cross = static_cast<double>(m.first - o.first) * (p.second - o.second) -
                           (m.second - o.second) * static_cast<double>(p.first - o.first);
      if (cross > 0) break;
      h.pop_back();
    }
    h.push_back(p);
  }
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
}

Activity make_activity(const DagNode& n, double unit) {
  Activity a;
  std::vector<std::pair<long, double>> pts;
  for (const auto& o : n.options) pts.push_back({std::lround(o.time_s / unit), o.energy_j});
  for (const auto& pt : pts) a.q.push_back(pt.first);
  build_staircase(n, a);
  build_envelope(std::move(pts), a);
  return a;
}

struct Arc {
  std::size_t u, v;
  int activity;  ///< node id, or -1 for a dummy arc
};

// The Pareto set of the points added so far, kept time descending (the solver adds points
// slowest first, so most additions append). Gives the same set as pareto_frontier over every
// point added: a point is dropped when an earlier one is at least as fast and as cheap.
class ParetoArchive {
 public:
  void add(FrontierPoint p) {
    // First point with time <= p's (the cheapest among those, since energy rises with speed).
    auto it = std::lower_bound(pts_.begin(), pts_.end(), p.time_s,
                               [](const FrontierPoint& a, double t) { return a.time_s > t; });
    if (it != pts_.end() && it->energy_j <= p.energy_j) return;
    // Points no faster and no cheaper than p, just before `it`, leave.
    auto first = it, last = it;
    while (first != pts_.begin() && std::prev(first)->energy_j >= p.energy_j) --first;
    if (last != pts_.end() && last->time_s == p.time_s) ++last;  // as fast, dearer
    it = pts_.erase(first, last);
    pts_.insert(it, std::move(p));
  }
  /// Whether add() would drop a point with these numbers.
  bool dominated(double time_s, double energy_j) const {
    auto it = std::lower_bound(pts_.begin(), pts_.end(), time_s,
                               [](const FrontierPoint& a, double t) { return a.time_s > t; });
    return it != pts_.end() && it->energy_j <= energy_j;
  }
  /// The set, fastest first.
  std::vector<FrontierPoint> take() {
    std::reverse(pts_.begin(), pts_.end());
    return std::move(pts_);
  }

 private:
  std::vector<FrontierPoint> pts_;
};

class Solver {
 public:
  Solver(const IterationDag& dag, double unit_s, bool warm);
  using ProgressFn = std::function<void(std::size_t, std::size_t)>;
  std::vector<FrontierPoint> run(const ProgressFn& progress, FrontierStats* stats);

 private:
  void build_adjacency();
  void build_network();
  long schedule();
  long fastest_makespan() const;
  long iteration_bound(long T) const;
  bool collect_critical();
  enum class Cut { kFound, kInfeasible, kInfinite };
  Cut min_cut(bool with_lb);
  bool feasible_flow(bool with_lb);
  bool maximize_flow(bool with_lb);
  bool shorten(long& T);
  void record(long T_units, bool fastest);
  void refine(double limit);
  void set_step(std::size_t i, std::size_t pos);
  double time_s(std::size_t i, int c) const {
    return opt_time_s_[opt_first_[i] + static_cast<std::size_t>(c)];
  }
  double energy_j(std::size_t i, int c) const {
    return opt_energy_j_[opt_first_[i] + static_cast<std::size_t>(c)];
  }
  void update_bounds(std::size_t i);
  long dur(const Arc& a) const {
    return a.activity < 0 ? 0L : d_[static_cast<std::size_t>(a.activity)];
  }
  static std::size_t in(std::size_t i) { return 2 + 2 * i; }
  static std::size_t out(std::size_t i) { return 3 + 2 * i; }

  // The DAG with its nodes renumbered in topological order (node k of dag_ is node order_[k] of
  // the caller's): every pass over the nodes then walks its arrays front to back.
  IterationDag dag_;
  std::vector<int> order_, rank_;  ///< rank_[caller's id] = internal id
  const double unit_s_;
  const std::size_t n_;
  std::vector<int> topo_;
  std::vector<Activity> act_;
  // Predecessors and successors (compressed rows), options' times and energies (flat): the
  // passes over every node that each iteration makes read contiguous memory.
  std::vector<std::size_t> pred_first_, succ_first_, opt_first_;
  std::vector<int> pred_, succ_;
  std::vector<double> opt_time_s_, opt_energy_j_;
  std::vector<Units> act_lb_, act_ub_;  ///< flow bounds of each activity at its duration
  // Activity-on-arc network: 0 = source, 1 = sink, node i -> in(i) -> out(i).
  std::vector<Arc> arcs_;
  std::vector<std::size_t> out_first_;  ///< first arc of each vertex (arcs sorted by tail)
  std::vector<long> d_, E_, L_;         ///< durations, earliest and latest times
  // The critical network of this iteration: arcs, bounds in units, compact vertex ids.
  std::vector<std::size_t> crit_, prev_crit_, global_, local_;
  std::vector<Units> lb_, ub_, prev_lb_, prev_ub_;
  std::vector<std::pair<std::size_t, std::size_t>> cu_;
  std::vector<Units> flow_, excess_;
  // The last maximum flow per AOA arc and the iteration that computed it (warm starts).
  std::vector<Units> arc_flow_;
  std::vector<int> arc_iteration_;
  bool warm_ = true;
  std::vector<char> side_;
  MaxFlow f1_, f2_;
  bool credits_ = true;
  int iterations_ = 0, no_credit_ = 0;
  std::vector<double> es_, ls_, fin_;
  // Snapped option per node (staircase step, its time and energy, the next step's time) and
  // the refined one of the point being recorded.
  std::vector<std::size_t> step_;
  std::vector<int> step_opt_, out_opt_;  ///< option index (the caller's numbering of options)
  std::vector<double> step_t_, step_e_, next_t_, out_t_, out_e_;
  ParetoArchive archive_;
  // Whether a snapped option changed since the last recorded point, and that point's snapped
  // makespan: an unchanged snap gives the same first refinement, which the archive already has.
  bool snap_changed_ = true;
  double snap_makespan_s_ = 0;
};

Solver::Solver(const IterationDag& dag, double unit_s, bool warm)
    : unit_s_(unit_s), n_(dag.nodes.size()), warm_(warm) {
  for (const auto& node : dag.nodes) {
    if (node.options.empty()) {
      throw InternalError(fmt::format("DAG node {} has no options", node.id));
    }
  }
  order_ = dag.topological_order();
  rank_.resize(n_);
  for (std::size_t k = 0; k < n_; ++k)
    rank_[static_cast<std::size_t>(order_[k])] = static_cast<int>(k);
  dag_.gpus = dag.gpus;
  dag_.static_power_w = dag.static_power_w;
  dag_.nodes.reserve(n_);
  for (int u : order_) dag_.nodes.push_back(dag.nodes[static_cast<std::size_t>(u)]);
  dag_.edges.reserve(dag.edges.size());
  for (const auto& [a, b] : dag.edges) {
    dag_.edges.emplace_back(rank_[static_cast<std::size_t>(a)], rank_[static_cast<std::size_t>(b)]);
  }
  std::sort(dag_.edges.begin(), dag_.edges.end());
  topo_.resize(n_);
  for (std::size_t k = 0; k < n_; ++k) topo_[k] = static_cast<int>(k);
  act_.reserve(n_);
  for (const auto& node : dag_.nodes) act_.push_back(make_activity(node, unit_s));
  build_adjacency();
  build_network();
  d_.resize(n_);
  act_lb_.resize(n_);
  act_ub_.resize(n_);
  for (std::size_t i = 0; i < n_; ++i) {
    d_[i] = act_[i].dmax;
    update_bounds(i);
  }
  es_.resize(n_);
  ls_.resize(n_);
  fin_.resize(n_);
  for (auto* v : {&step_t_, &step_e_, &next_t_, &out_t_, &out_e_}) v->resize(n_);
  step_.resize(n_);
  step_opt_.resize(n_);
  out_opt_.resize(n_);
  for (std::size_t i = 0; i < n_; ++i) set_step(i, act_[i].snap_step(d_[i]));
}

void Solver::build_adjacency() {
  pred_first_.assign(n_ + 1, 0);
  succ_first_.assign(n_ + 1, 0);
  for (const auto& [a, b] : dag_.edges) {
    ++succ_first_[static_cast<std::size_t>(a) + 1];
    ++pred_first_[static_cast<std::size_t>(b) + 1];
  }
  for (std::size_t i = 0; i < n_; ++i) {
    succ_first_[i + 1] += succ_first_[i];
    pred_first_[i + 1] += pred_first_[i];
  }
  pred_.resize(dag_.edges.size());
  succ_.resize(dag_.edges.size());
  std::vector<std::size_t> ps(pred_first_.begin(), pred_first_.end() - 1);
  std::vector<std::size_t> ss(succ_first_.begin(), succ_first_.end() - 1);
  for (const auto& [a, b] : dag_.edges) {
    succ_[ss[static_cast<std::size_t>(a)]++] = b;
    pred_[ps[static_cast<std::size_t>(b)]++] = a;
  }
  opt_first_.assign(1, 0);
  for (const auto& node : dag_.nodes) {
    for (const auto& o : node.options) {
      opt_time_s_.push_back(o.time_s);
      opt_energy_j_.push_back(o.energy_j);
    }
    opt_first_.push_back(opt_time_s_.size());
  }
}

// Flow bounds of activity i at its current duration: energy added by shortening it one unit
// (infinite at its fastest), energy saved by lengthening it one unit (0 at its slowest).
void Solver::update_bounds(std::size_t i) {
  const Activity& x = act_[i];
  double lj = 0, uj = kInf;
  if (d_[i] > x.dmin) uj = std::max(0.0, x.cost(d_[i] - 1) - x.cost(d_[i]));
  if (d_[i] < x.dmax) lj = std::max(0.0, x.cost(d_[i]) - x.cost(d_[i] + 1));
  act_lb_[i] = to_units(std::min(lj, uj));
  act_ub_[i] = uj < kInf ? std::min(to_units(uj), kInfUnits) : kInfUnits;
}

void Solver::build_network() {
  const std::size_t V = 2 + 2 * n_;
  for (const auto& [a, b] : dag_.edges) {
    arcs_.push_back({out(static_cast<std::size_t>(a)), in(static_cast<std::size_t>(b)), -1});
  }
  for (std::size_t i = 0; i < n_; ++i) {
    arcs_.push_back({in(i), out(i), static_cast<int>(i)});
    if (pred_first_[i] == pred_first_[i + 1]) arcs_.push_back({0, in(i), -1});
    if (succ_first_[i] == succ_first_[i + 1]) arcs_.push_back({out(i), 1, -1});
  }
  // Arcs by tail vertex: the pass over all arcs that finds the critical ones reads the event
  // times nearly in order.
  std::stable_sort(arcs_.begin(), arcs_.end(),
                   [](const Arc& x, const Arc& y) { return x.u < y.u; });
  out_first_.assign(V + 1, 0);
  for (const Arc& a : arcs_) ++out_first_[a.u + 1];
  for (std::size_t v = 0; v < V; ++v) out_first_[v + 1] += out_first_[v];
  E_.resize(V);
  L_.resize(V);
  local_.assign(V, static_cast<std::size_t>(-1));
  arc_flow_.assign(arcs_.size(), 0);
  arc_iteration_.assign(arcs_.size(), -1);
  side_.assign(V, 0);
}

// Earliest and latest event times of the current durations; returns the makespan (units).
// Computed on the nodes (in topological numbering, so both passes read the arrays in order): an
// activity's in-vertex has the activity as its only out-arc and its out-vertex has it as its
// only in-arc, so the event times of the activity-on-arc network follow from each node's
// earliest start and latest finish.
long Solver::schedule() {
  long T = 0;
  for (std::size_t i = 0; i < n_; ++i) {
    long es = 0;
    for (std::size_t k = pred_first_[i]; k < pred_first_[i + 1]; ++k) {
      es = std::max(es, E_[out(static_cast<std::size_t>(pred_[k]))]);
    }
    E_[in(i)] = es;
    E_[out(i)] = es + d_[i];
    T = std::max(T, es + d_[i]);
  }
  E_[0] = 0;
  E_[1] = T;
  long first = T;
  for (std::size_t i = n_; i-- > 0;) {
    long lf = T;
    for (std::size_t k = succ_first_[i]; k < succ_first_[i + 1]; ++k) {
      lf = std::min(lf, L_[in(static_cast<std::size_t>(succ_[k]))]);
    }
    L_[out(i)] = lf;
    L_[in(i)] = lf - d_[i];
    first = std::min(first, lf - d_[i]);
  }
  L_[0] = first;
  L_[1] = T;
  return T;
}

long Solver::fastest_makespan() const {
  std::vector<long> fin(n_, 0);
  long T = 0;
  for (int u : topo_) {
    const auto i = static_cast<std::size_t>(u);
    long start = 0;
    for (std::size_t k = pred_first_[i]; k < pred_first_[i + 1]; ++k) {
      start = std::max(start, fin[static_cast<std::size_t>(pred_[k])]);
    }
    fin[i] = start + act_[i].dmin;
    T = std::max(T, fin[i]);
  }
  return T;
}

// Each iteration shortens the makespan by at least one unit, from T down to the makespan at
// every activity's fastest duration: that bounds the iterations before any work is done.
long Solver::iteration_bound(long T) const {
  const long bound = T - fastest_makespan() + 1;
  if (bound <= kMaxIterations) return bound;
  const double span_s = static_cast<double>(bound - 1) * unit_s_;
  throw InvalidInput(fmt::format(
      "--unit {:g} s: the frontier solver would need up to {} iterations ({:.3f} s of makespan "
      "range in steps of the unit), over the limit of {}; use --unit {:.2g} or larger",
      unit_s_, bound, span_s, kMaxIterations, 1.05 * span_s / static_cast<double>(kMaxIterations)));
}

// Critical arcs of the current schedule and their flow bounds; true when the network (arcs and
// bounds) is the previous iteration's, whose cut then still holds.
bool Solver::collect_critical() {
  std::swap(crit_, prev_crit_);
  std::swap(lb_, prev_lb_);
  std::swap(ub_, prev_ub_);
  crit_.clear();
  lb_.clear();
  ub_.clear();
  // A vertex with float leaves only non-critical arcs; a node with float has float at both of
  // its vertices, so its arcs are skipped without looking at them.
  auto scan = [&](std::size_t u) {
    for (std::size_t k = out_first_[u]; k < out_first_[u + 1]; ++k) {
      const Arc& a = arcs_[k];
      if (E_[a.u] + dur(a) != L_[a.v]) continue;
      const auto i = static_cast<std::size_t>(a.activity);
      crit_.push_back(k);
      lb_.push_back(a.activity < 0 ? 0 : act_lb_[i]);
      ub_.push_back(a.activity < 0 ? kInfUnits : act_ub_[i]);
    }
  };
  scan(0);  // the source is always critical: E = L = 0
  for (std::size_t i = 0; i < n_; ++i) {
    if (E_[in(i)] != L_[in(i)]) continue;
    scan(in(i));
    scan(out(i));
  }
  return warm_ && iterations_ > 1 && crit_ == prev_crit_ && lb_ == prev_lb_ && ub_ == prev_ub_;
}

// With quantized costs the lower bounds can be infeasible (the current durations are then not
// optimal for this T); the cut is then taken without lengthening credits (lb = 0), which is
// always feasible. Fills side_ (source side of the cut, by AOA vertex).
Solver::Cut Solver::min_cut(bool with_lb) {
  for (std::size_t v : global_) local_[v] = static_cast<std::size_t>(-1);
  global_.clear();
  auto id = [&](std::size_t v) {
    if (local_[v] == static_cast<std::size_t>(-1)) {
      local_[v] = global_.size();
      global_.push_back(v);
    }
    return local_[v];
  };
  id(0);
  id(1);
  cu_.resize(crit_.size());
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    cu_[c] = {id(arcs_[crit_[c]].u), id(arcs_[crit_[c]].v)};
  }
  if (!feasible_flow(with_lb)) return Cut::kInfeasible;
  return maximize_flow(with_lb) ? Cut::kFound : Cut::kInfinite;
}

// Step 1: a flow meeting the bounds. It starts from the previous iteration's flow on the arcs
// still critical (clamped to the new bounds) or the lower bound on the others, and repairs the
// imbalance this leaves by a maximum flow from a super source (vertices with excess) to a
// super sink (vertices short of flow) in its residual network, with a sink-to-source arc
// closing the circulation (Hoffman's feasibility condition). A small change of the network
// leaves a small imbalance: few augmenting paths.
bool Solver::feasible_flow(bool with_lb) {
  const std::size_t W = global_.size();
  excess_.assign(W, 0);
  flow_.resize(crit_.size());
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    const std::size_t k = crit_[c];
    const Units l = with_lb ? lb_[c] : 0;
    const bool known = warm_ && arc_iteration_[k] == iterations_ - 1;
    flow_[c] = known ? std::clamp(arc_flow_[k], l, ub_[c]) : l;
    excess_[cu_[c].second] += flow_[c];
    excess_[cu_[c].first] -= flow_[c];
  }
  const Units value = std::max<Units>(0, excess_[1]);  // flow into the sink goes back to s
  excess_[1] -= value;
  excess_[0] += value;
  Units need = 0;
  for (std::size_t v = 0; v < W; ++v) need += std::max<Units>(0, excess_[v]);
  if (need == 0) return true;
  f1_.reset(W + 2);
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    const auto [u, v] = cu_[c];
    f1_.add(u, v, ub_[c] - flow_[c], flow_[c] - (with_lb ? lb_[c] : Units{0}));  // id 2c
  }
  f1_.add(1, 0, kInfUnits - value, value);
  for (std::size_t v = 0; v < W; ++v) {
    if (excess_[v] > 0) f1_.add(W, v, excess_[v]);
    if (excess_[v] < 0) f1_.add(v, W + 1, -excess_[v]);
  }
  // Bounds and flows are integers, so the test is exact. (A tolerance of one unit per vertex,
  // kept from when bounds were rounded doubles, accepted any warm start whose imbalance was that
  // small without repairing it: the "maximum flow" then started from a flow that did not
  // conserve, and its cut could differ from the from-scratch one.)
  if (f1_.run(W, W + 1) < need) return false;
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    flow_[c] += f1_.flow(2 * c);
  }
  return true;
}

// Step 2: maximize it from source to sink in its residual network; the cut is what the source
// still reaches. False when the flow is unbounded (a path of arcs that cannot be shortened).
bool Solver::maximize_flow(bool with_lb) {
  const std::size_t W = global_.size();
  f2_.reset(W);
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    const auto [u, v] = cu_[c];
    const Units l = with_lb ? lb_[c] : 0;
    f2_.add(u, v, ub_[c] - flow_[c], flow_[c] - l);  // arc id 2c
  }
  if (f2_.run(0, 1) >= kInfUnits / 2) return false;
  for (std::size_t k = 0; k < W; ++k) side_[global_[k]] = f2_.reachable(k);
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    arc_flow_[crit_[c]] = flow_[c] + f2_.flow(2 * c);
    arc_iteration_[crit_[c]] = iterations_;
  }
  return true;
}

// One Phillips-Dessouky step: the cheapest cut, applied. Returns false when the project cannot
// get shorter; otherwise T becomes the new makespan.
bool Solver::shorten(long& T) {
  if (!collect_critical()) {
    for (std::size_t v : global_) side_[v] = 0;
    Cut cut = min_cut(true);
    credits_ = cut != Cut::kInfeasible;
    if (!credits_) cut = min_cut(false);
    if (cut != Cut::kFound) return false;
  } else {
    for (std::size_t k : crit_) arc_iteration_[k] = iterations_;
  }
  if (!credits_) ++no_credit_;
  std::vector<std::size_t> faster, slower;
  for (std::size_t c = 0; c < crit_.size(); ++c) {
    const Arc& a = arcs_[crit_[c]];
    if (side_[a.u] && !side_[a.v]) {
      const auto i = static_cast<std::size_t>(a.activity);
      if (a.activity < 0 || d_[i] <= act_[i].dmin) return false;  // not a finite cut
      faster.push_back(i);
    } else if (!side_[a.u] && side_[a.v] && a.activity >= 0) {
      slower.push_back(static_cast<std::size_t>(a.activity));
    }
  }
  if (faster.empty()) return false;
  for (std::size_t i : faster) --d_[i];
  std::vector<std::size_t> lengthened;
  for (std::size_t i : slower) {
    if (d_[i] < act_[i].dmax) {
      ++d_[i];
      lengthened.push_back(i);
    }
  }
  long T2 = schedule();
  if (T2 > T - 1) {
    // A lengthened arc made a non-critical path too long: keep only the shortenings.
    for (std::size_t i : lengthened) --d_[i];
    lengthened.clear();
    T2 = schedule();
  }
  for (auto* changed : {&faster, &slower}) {
    for (std::size_t i : *changed) {
      update_bounds(i);
      set_step(i, act_[i].snap_step(d_[i]));
    }
  }
  if (T2 >= T) return false;
  T = T2;
  return true;
}

// Node i's snapped option becomes staircase step `pos`. The snapped options live in dense
// arrays updated only for the activities whose duration changed, so that recording a point
// reads contiguous memory instead of every node's option lists.
void Solver::set_step(std::size_t i, std::size_t pos) {
  const Activity& a = act_[i];
  if (step_[i] != pos) snap_changed_ = true;
  step_[i] = pos;
  step_t_[i] = a.stair_t[pos];
  step_opt_[i] = a.stair[pos];
  step_e_[i] = energy_j(i, step_opt_[i]);
  next_t_[i] = pos + 1 < a.stair.size() ? a.stair_t[pos + 1] : std::numeric_limits<double>::max();
}

// Hands slack back: as-late-as-possible, each activity (reverse topological order) takes its
// cheapest option that still finishes by its successors' start and by `limit`. Starts from the
// snapped options, uses es_ (their earliest starts) and adds the result to the archive.
void Solver::refine(double limit) {
  for (auto it = topo_.rbegin(); it != topo_.rend(); ++it) {
    const auto i = static_cast<std::size_t>(*it);
    double lf = limit;
    for (std::size_t k = succ_first_[i]; k < succ_first_[i + 1]; ++k) {
      lf = std::min(lf, ls_[static_cast<std::size_t>(succ_[k])]);
    }
    const double budget_s = lf * (1 + 1e-12) - es_[i];
    out_opt_[i] = step_opt_[i];
    out_t_[i] = step_t_[i];
    out_e_[i] = step_e_[i];
    if (next_t_[i] <= budget_s) {  // a cheaper staircase step fits
      const Activity& a = act_[i];
      const auto pos = static_cast<std::size_t>(
          std::upper_bound(a.stair_t.begin(), a.stair_t.end(), budget_s) - a.stair_t.begin() - 1);
      out_t_[i] = a.stair_t[pos];
      out_opt_[i] = a.stair[pos];
      out_e_[i] = energy_j(i, out_opt_[i]);
    }
    ls_[i] = lf - out_t_[i];
  }
  FrontierPoint p;
  for (int u : topo_) {  // the makespan of the final choice
    const auto i = static_cast<std::size_t>(u);
    double start = 0;
    for (std::size_t k = pred_first_[i]; k < pred_first_[i + 1]; ++k) {
      start = std::max(start, fin_[static_cast<std::size_t>(pred_[k])]);
    }
    fin_[i] = start + out_t_[i];
    p.time_s = std::max(p.time_s, fin_[i]);
  }
  // Summed in the caller's node order: the same rounding as IterationDag::energy_j.
  for (int i : rank_) p.dynamic_energy_j += out_e_[static_cast<std::size_t>(i)];
  p.energy_j = p.dynamic_energy_j + dag_.gpus * dag_.static_power_w * p.time_s;
  if (archive_.dominated(p.time_s, p.energy_j)) return;
  p.choice.resize(n_);
  for (std::size_t j = 0; j < n_; ++j) p.choice[j] = out_opt_[static_cast<std::size_t>(rank_[j])];
  archive_.add(std::move(p));
}

// Real options for the quantized durations: snap, then refine twice, within the snapped
// makespan and within the solver's current deadline T (the snap can leave time unused).
// `fastest`: every activity at its fastest real option instead of the snapped durations, so
// that the frontier's fast end is exact even when options share a quantized duration.
void Solver::record(long T_units, bool fastest) {
  if (fastest) {
    for (std::size_t i = 0; i < n_; ++i) set_step(i, 0);
  }
  const double target = static_cast<double>(T_units) * unit_s_;
  if (!snap_changed_) {  // es_ still holds the snapped earliest starts
    if (target > snap_makespan_s_) refine(target);
    return;
  }
  snap_changed_ = false;
  double M = 0;
  for (int u : topo_) {
    const auto i = static_cast<std::size_t>(u);
    es_[i] = 0;
    for (std::size_t k = pred_first_[i]; k < pred_first_[i + 1]; ++k) {
      const auto pi = static_cast<std::size_t>(pred_[k]);
      es_[i] = std::max(es_[i], es_[pi] + step_t_[pi]);
    }
    M = std::max(M, es_[i] + step_t_[i]);
  }
  snap_makespan_s_ = M;
  refine(M);
  if (target > M) refine(target);
}

std::vector<FrontierPoint> Solver::run(const ProgressFn& progress, FrontierStats* stats) {
  const long T0 = schedule();
  const long bound = iteration_bound(T0);
  const auto total = static_cast<std::size_t>(bound);
  if (progress) progress(0, total);
  long T = T0;
  record(T, false);
  while (true) {
    ++iterations_;
    if (!shorten(T)) break;
    record(T, false);
    // Each step shortens the makespan by at least one unit: units gained out of the bound.
    if (progress && iterations_ % 64 == 0) progress(static_cast<std::size_t>(T0 - T), total);
  }
  record(0, true);
  if (progress) progress(total, total);
  if (stats) {
    stats->iterations = iterations_;
    stats->cuts_without_credit = no_credit_;
  }
  return archive_.take();
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

std::vector<FrontierPoint> pareto_frontier(const std::vector<FrontierPoint>& points) {
  std::vector<Point2> pts;
  pts.reserve(points.size());
  for (const auto& p : points) pts.push_back({p.time_s, p.energy_j});
  std::vector<FrontierPoint> front;
  for (std::size_t i : pareto_front(pts)) front.push_back(points[i]);
  return front;
}

std::vector<FrontierPoint> solve_frontier(const IterationDag& dag, const FrontierOptions& o,
                                          FrontierStats* stats) {
  const auto t_start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_s();
  if (!(o.unit_s > 0) || !std::isfinite(o.unit_s)) {
    throw InvalidInput(fmt::format("--unit must be a finite number > 0, got {}", o.unit_s));
  }
  if (dag.nodes.empty()) return {};
  std::vector<FrontierPoint> front = Solver(dag, o.unit_s, o.warm_start).run(o.progress, stats);
  if (stats) {
    stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    stats->cpu_seconds = thread_cpu_s() - cpu_start;
  }
  return front;
}

}  // namespace kareus
