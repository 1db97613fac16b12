// The iteration DAG in activity-on-node form, as Perseus (Chung et al., SOSP '24) builds it: one
// node per pipeline instruction, message and reduction, an edge where one must end before the
// next starts. A choice of one option per node has a makespan (longest path, Kahn's topological
// order) and an energy (dynamic energies plus static power over the makespan).
#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "kareus/error.h"
#include "kareus/frontier.h"

namespace kareus {

const char* to_string(DagNodeKind k) {
  switch (k) {
    case DagNodeKind::kForward:
      return "forward";
    case DagNodeKind::kBackward:
      return "backward";
    case DagNodeKind::kP2p:
      return "p2p";
    case DagNodeKind::kIteration:
      return "iteration";
    case DagNodeKind::kDataParallel:
      return "dp";
  }
  return "?";
}

DagNodeKind dag_node_kind(InstructionKind k) {
  return k == InstructionKind::kForward ? DagNodeKind::kForward : DagNodeKind::kBackward;
}

std::vector<int> IterationDag::topological_order() const {
  const std::size_t n = nodes.size();
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<int>> succ(n);
  for (const auto& [a, b] : edges) {
    succ[static_cast<std::size_t>(a)].push_back(b);
    ++indeg[static_cast<std::size_t>(b)];
  }
  std::queue<int> q;
  for (std::size_t i = 0; i < n; ++i) {
    if (indeg[i] == 0) q.push(static_cast<int>(i));
  }
  std::vector<int> order;
  while (!q.empty()) {
    const int u = q.front();
    q.pop();
    order.push_back(u);
    for (int v : succ[static_cast<std::size_t>(u)]) {
      if (--indeg[static_cast<std::size_t>(v)] == 0) q.push(v);
    }
  }
  if (order.size() != n) throw InternalError("iteration DAG has a cycle");
  return order;
}

double IterationDag::makespan_s(const std::vector<int>& choice) const {
  std::vector<double> finish(nodes.size(), 0.0), start(nodes.size(), 0.0);
  std::vector<std::vector<int>> pred(nodes.size());
  for (const auto& [a, b] : edges) pred[static_cast<std::size_t>(b)].push_back(a);
  double t = 0;
  for (int u : topological_order()) {
    const auto i = static_cast<std::size_t>(u);
    for (int p : pred[i]) start[i] = std::max(start[i], finish[static_cast<std::size_t>(p)]);
    finish[i] = start[i] + nodes[i].options[static_cast<std::size_t>(choice[i])].time_s;
    t = std::max(t, finish[i]);
  }
  return t;
}

double IterationDag::energy_j(const std::vector<int>& choice) const {
  double e = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    e += nodes[i].options[static_cast<std::size_t>(choice[i])].energy_j;
  }
  return e + gpus * static_power_w * makespan_s(choice);
}

}  // namespace kareus
