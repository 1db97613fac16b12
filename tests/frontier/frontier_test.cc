// The frontier solver against brute force over every option combination on small 1F1B DAGs.
#include "kareus/frontier.h"

#include <gtest/gtest.h>

#include <random>

#include "kareus/emulator.h"
#include "kareus/pareto.h"

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
  for (int s = 0; s < stages; ++s) {
    for (const auto& [k, mb] : one_f_one_b_order(s, stages, mbs)) {
      DagNode n;
      n.stage = s;
      n.instruction = to_string(k);
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
      msg.instruction = "p2p";
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
    const auto front = solve_frontier(dag, {1e-3});
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
  dag.nodes = {{0, 0, "forward", 0, {{0.010, 5}, {0.012, 3}, {0.015, 2}}},
               {1, 0, "backward", 0, {{0.020, 9}, {0.025, 4}}}};
  dag.edges = {{0, 1}};
  const auto f = solve_frontier(dag, {1e-3});
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
  dag.nodes = {{0, 0, "forward", 0, {{0.010, 5}, {0.020, 4}}}};
  dag.static_power_w = 50;  // 10 ms more cost 0.5 J static, save 1 J dynamic
  auto f = solve_frontier(dag);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_NEAR(f.back().energy_j, 4 + 50 * 0.020, 1e-12);
  dag.static_power_w = 200;  // 10 ms more cost 2 J: the slow option is dominated
  f = solve_frontier(dag);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NEAR(f[0].time_s, 0.010, 1e-12);
}

}  // namespace
}  // namespace kareus
