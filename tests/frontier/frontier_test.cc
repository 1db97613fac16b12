// The frontier solver against brute force over every option combination on small 1F1B DAGs.
#include "kareus/frontier.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/pareto.h"
#include "kareus/schedule.h"

namespace kareus {
namespace {

// 1F1B over `stages` x `mbs` with one P2P node per message; random Pareto options per node.
IterationDag random_dag(int stages, int mbs, int max_options, std::mt19937_64& rng) {
  IterationDag dag;
  dag.static_power_w = 85;
  dag.gpus = 2 * stages;
  std::uniform_real_distribution<double> base(0.05, 0.2), step(0.002, 0.03), save(0.2, 3.0);
  std::uniform_int_distribution<int> nopt(1, max_options);
  std::map<std::tuple<int, int, int>, int> id;
  std::vector<int> last(static_cast<std::size_t>(stages), -1);
  auto add = [&](DagNode n) {
    n.id = static_cast<int>(dag.nodes.size());
    dag.nodes.push_back(n);
    return n.id;
  };
  const Schedule sched(stages, 1, mbs);
  for (int s = 0; s < stages; ++s) {
    for (const auto& x : sched.order(s)) {
      const InstructionKind k = x.kind;
      const int mb = x.microbatch;
      DagNode n;
      n.stage = s;
      n.instruction = dag_node_kind(k);
      n.microbatch = mb;
      double t = base(rng), e = 10 + 40 * base(rng) / 0.2;
      const int k_opts = nopt(rng);
      for (int o = 0; o < k_opts; ++o) {
        n.options.push_back({t, e});
        t += step(rng);
        e -= save(rng);  // slower and cheaper: a Pareto set
      }
      const int v = add(n);
      id[{s, static_cast<int>(k), mb}] = v;
      if (last[static_cast<std::size_t>(s)] >= 0)
        dag.edges.push_back({last[static_cast<std::size_t>(s)], v});
      last[static_cast<std::size_t>(s)] = v;
    }
  }
  for (int mb = 0; mb < mbs; ++mb) {
    for (int s = 0; s + 1 < stages; ++s) {
      DagNode msg;
      msg.instruction = DagNodeKind::kP2p;
      msg.options = {{0.004, 0.1}};
      const int a = add(msg), b = add(msg);
      dag.edges.push_back({id.at({s, 0, mb}), a});
      dag.edges.push_back({a, id.at({s + 1, 0, mb})});
      dag.edges.push_back({id.at({s + 1, 1, mb}), b});
      dag.edges.push_back({b, id.at({s, 1, mb})});
    }
  }
  return dag;
}

FrontierOptions with_unit(double unit_s) {
  FrontierOptions o;
  o.unit_s = unit_s;
  return o;
}

struct Combo {
  double time_s, dyn_j;
};

std::vector<Combo> brute_force(const IterationDag& dag) {
  std::vector<Combo> out;
  std::vector<int> choice(dag.nodes.size(), 0);
  while (true) {
    double dyn = 0;
    for (std::size_t i = 0; i < choice.size(); ++i)
      dyn += dag.nodes[i].options[static_cast<std::size_t>(choice[i])].energy_j;
    out.push_back({dag.makespan_s(choice), dyn});
    std::size_t i = 0;
    for (; i < choice.size(); ++i) {
      if (++choice[i] < static_cast<int>(dag.nodes[i].options.size())) break;
      choice[i] = 0;
    }
    if (i == choice.size()) break;
  }
  return out;
}

void check_against_brute_force(int stages, int mbs, int max_options, int trials,
                               std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const IterationDag dag = random_dag(stages, mbs, max_options, rng);
    const auto all = brute_force(dag);
    const auto front = solve_frontier(dag, with_unit(1e-3));
    ASSERT_FALSE(front.empty());
    // Reported numbers are the real options' numbers.
    for (const auto& p : front) {
      EXPECT_NEAR(p.time_s, dag.makespan_s(p.choice), 1e-12);
      EXPECT_NEAR(p.energy_j, dag.energy_j(p.choice), 1e-9);
    }
    double tmin = 1e300, tmax = 0;
    for (const auto& c : all) {
      tmin = std::min(tmin, c.time_s);
      tmax = std::max(tmax, c.time_s);
    }
    // The solver reaches the fastest time (within one time unit of quantization).
    EXPECT_LE(front.front().time_s, tmin + 2e-3) << "trial " << trial;
    double worst = 0;
    for (int g = 0; g <= 40; ++g) {
      const double deadline = tmin + 2e-3 + (tmax - tmin) * g / 40.0;
      double best_bf = 1e300, best_fr = 1e300;
      for (const auto& c : all) {
        if (c.time_s <= deadline)
          best_bf = std::min(best_bf, c.dyn_j + dag.gpus * dag.static_power_w * c.time_s);
      }
      for (const auto& p : front) {
        if (p.time_s <= deadline) best_fr = std::min(best_fr, p.energy_j);
      }
      ASSERT_LT(best_fr, 1e300) << "no frontier point meets deadline " << deadline;
      worst = std::max(worst, best_fr / best_bf - 1.0);
      EXPECT_LE(best_fr, best_bf * 1.005) << "trial " << trial << " deadline " << deadline;
      EXPECT_GE(best_fr, best_bf * (1 - 1e-9));  // never better than the optimum
    }
    ::testing::Test::RecordProperty("worst_gap_trial_" + std::to_string(trial),
                                    std::to_string(worst));
  }
}

TEST(Frontier, MatchesBruteForceTwoStagesTwoMicrobatchesFiveOptions) {
  check_against_brute_force(2, 2, 5, 12, 11);
}

TEST(Frontier, MatchesBruteForceTwoStagesThreeMicrobatchesThreeOptions) {
  check_against_brute_force(2, 3, 3, 6, 12);
}

TEST(Frontier, SingleChainIsExact) {
  // One stage, one micro-batch: forward then backward; the frontier is the Pareto set of sums.
  IterationDag dag;
  dag.static_power_w = 0;
  dag.gpus = 1;
  dag.nodes = {{0, 0, DagNodeKind::kForward, 0, {{0.010, 5}, {0.012, 3}, {0.015, 2}}},
               {1, 0, DagNodeKind::kBackward, 0, {{0.020, 9}, {0.025, 4}}}};
  dag.edges = {{0, 1}};
  const auto f = solve_frontier(dag, with_unit(1e-3));
  // Sums: (30,14) (35,9) (32,12) (37,7) (35,11) (40,6); Pareto: 30/14, 32/12, 35/9, 37/7, 40/6.
  ASSERT_EQ(f.size(), 5u);
  const double t[] = {0.030, 0.032, 0.035, 0.037, 0.040}, e[] = {14, 12, 9, 7, 6};
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(f[i].time_s, t[i], 1e-12);
    EXPECT_NEAR(f[i].energy_j, e[i], 1e-12);
  }
}

TEST(Frontier, StaticPowerMovesTheMinimumEnergyPoint) {
  IterationDag dag;
  dag.gpus = 1;
  dag.nodes = {{0, 0, DagNodeKind::kForward, 0, {{0.010, 5}, {0.020, 4}}}};
  dag.static_power_w = 50;  // 10 ms more cost 0.5 J static, save 1 J dynamic
  auto f = solve_frontier(dag);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_NEAR(f.back().energy_j, 4 + 50 * 0.020, 1e-12);
  dag.static_power_w = 200;  // 10 ms more cost 2 J: the slow option is dominated
  f = solve_frontier(dag);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NEAR(f[0].time_s, 0.010, 1e-12);
}

// The warm-started solver (each maximum flow starts from the previous iteration's, an unchanged
// critical network reuses its cut) against every cut computed from scratch. The cut is the set
// of vertices the source reaches in the residual network of a maximum flow, which is the same
// for every maximum flow, so the frontiers must be identical, choices included.
TEST(Frontier, WarmStartGivesTheFromScratchFrontier) {
  std::mt19937_64 rng(21);
  const int shapes[][3] = {{2, 4, 6}, {3, 6, 8}, {4, 8, 5}, {4, 12, 10}, {6, 10, 4}};
  int compared = 0;
  for (const auto& [stages, mbs, opts] : shapes) {
    for (double unit_s : {1e-3, 4e-3}) {
      const IterationDag dag = random_dag(stages, mbs, opts, rng);
      FrontierOptions warm, cold;
      warm.unit_s = cold.unit_s = unit_s;
      cold.warm_start = false;
      FrontierStats ws, cs;
      const auto a = solve_frontier(dag, warm, &ws);
      const auto b = solve_frontier(dag, cold, &cs);
      EXPECT_EQ(ws.iterations, cs.iterations);
      EXPECT_GT(ws.iterations, 10);  // enough cuts for warm starts to matter
      ASSERT_EQ(a.size(), b.size()) << stages << "x" << mbs << " unit " << unit_s;
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].time_s, b[i].time_s);
        EXPECT_EQ(a[i].energy_j, b[i].energy_j);
        EXPECT_EQ(a[i].choice, b[i].choice);
        if (i > 0) {  // a Pareto set, fastest first
          EXPECT_GT(a[i].time_s, a[i - 1].time_s);
          EXPECT_LT(a[i].energy_j, a[i - 1].energy_j);
        }
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 10);
}

// A unit too fine for the makespan range is refused before any cut, naming --unit, the
// iteration count it would need and the limit.
TEST(Frontier, UnitTooFineForTheIterationLimitIsInvalidInput) {
  IterationDag dag;
  dag.gpus = 1;
  dag.nodes = {{0, 0, DagNodeKind::kForward, 0, {{0.010, 5}, {1.010, 1}}}};
  // 1.010 s / 1e-7 s - 0.010 s / 1e-7 s + 1 = 10,000,001 iterations at most.
  try {
    solve_frontier(dag, with_unit(1e-7));
    FAIL() << "no InvalidInput";
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--unit"), std::string::npos) << msg;
    EXPECT_NE(msg.find("10000001"), std::string::npos) << msg;
    EXPECT_NE(msg.find("200000"), std::string::npos) << msg;
  }
  // 1 ms: 1001 iterations at most, well within the limit; the frontier has both options.
  EXPECT_EQ(solve_frontier(dag, with_unit(1e-3)).size(), 2u);
  EXPECT_THROW(solve_frontier(dag, with_unit(0.0)), InvalidInput);
  EXPECT_THROW(solve_frontier(dag, with_unit(std::nan(""))), InvalidInput);
}

TEST(Frontier, ProgressCountsUnitsUpToTheBound) {
  std::mt19937_64 rng(5);
  const IterationDag dag = random_dag(3, 6, 6, rng);
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  FrontierOptions o;
  o.progress = [&](std::size_t done, std::size_t total) { calls.push_back({done, total}); };
  FrontierStats st;
  solve_frontier(dag, o, &st);
  ASSERT_GE(calls.size(), 2u);
  const std::size_t total = calls.front().second;
  EXPECT_EQ(calls.front().first, 0u);
  EXPECT_EQ(calls.back(), std::make_pair(total, total));
  EXPECT_GE(total + 1, static_cast<std::size_t>(st.iterations));  // the bound holds
  for (std::size_t i = 1; i < calls.size(); ++i) {
    EXPECT_GE(calls[i].first, calls[i - 1].first);
    EXPECT_EQ(calls[i].second, total);
  }
}

}  // namespace
}  // namespace kareus
