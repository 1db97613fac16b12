// Composition against brute force over every configuration combination.
#include "kareus/compose.h"

#include <gtest/gtest.h>

#include <random>

#include "kareus/pareto.h"
#include "test_util.h"

namespace kareus {
namespace {

TEST(Compose, MatchesBruteForceOverAllCombinations) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  const std::vector<int> freqs = {1410, 1200};
  std::map<std::string, PartitionFronts> fronts;
  for (const auto& p : ps.partitions) {
    for (int f : freqs) {
      double t = 1e-3 * u(rng), e = 0.5 * u(rng);
      for (int k = 0; k < 4; ++k) {  // a Pareto set of 4 options per clock
        fronts[p.key][f].push_back({{f, 3 + 3 * k, p.slots.front().name}, t, e});
        t *= 1.05 + 0.1 * u(rng);
        e *= 0.8 + 0.1 * u(rng);
      }
    }
  }
  SegmentCostFn seg = [](const Segment& s, int f) {
    return PartitionOption{
        {f, 0, "-"}, 1e-4 * static_cast<double>(s.kernels.size()) * 1410.0 / f, 0.01 * f / 1410.0};
  };
  for (InstructionKind k : {InstructionKind::kForward, InstructionKind::kBackward}) {
    const auto got = compose_instruction(ps, 0, k, fronts, seg, {freqs});
    // Brute force: every combination of one option per partition, at every clock.
    std::map<std::string, int> count;
    double seg_t[2] = {0, 0}, seg_e[2] = {0, 0};
    for (const auto& st : ps.instruction(0, k).steps) {
      if (st.kind == Step::Kind::kPartition) {
        ++count[ps.partitions[static_cast<std::size_t>(st.index)].key];
      } else {
        for (int fi = 0; fi < 2; ++fi) {
          const auto c = seg(ps.segments[static_cast<std::size_t>(st.index)], freqs[fi]);
          seg_t[fi] += c.time_s;
          seg_e[fi] += c.dynamic_energy_j;
        }
      }
    }
    std::vector<std::string> keys;
    for (const auto& [key, n] : count) keys.push_back(key);
    std::vector<Point2> all;
    for (int fi = 0; fi < 2; ++fi) {
      std::vector<std::size_t> idx(keys.size(), 0);
      while (true) {
        double t = seg_t[fi], e = seg_e[fi];
        for (std::size_t j = 0; j < keys.size(); ++j) {
          const auto& o = fronts[keys[j]][freqs[fi]][idx[j]];
          t += count[keys[j]] * o.time_s;
          e += count[keys[j]] * o.dynamic_energy_j;
        }
        all.push_back({t, e});
        std::size_t j = 0;
        for (; j < keys.size(); ++j) {
          if (++idx[j] < 4) break;
          idx[j] = 0;
        }
        if (j == keys.size()) break;
      }
    }
    const auto bf = pareto_front(all);
    ASSERT_EQ(got.size(), bf.size()) << to_string(k);
    for (std::size_t i = 0; i < bf.size(); ++i) {
      EXPECT_NEAR(got[i].time_s, all[bf[i]].x, 1e-12);
      EXPECT_NEAR(got[i].dynamic_energy_j, all[bf[i]].y, 1e-12);
    }
    // Every option names a configuration for each partition of the instruction, at its clock.
    for (const auto& o : got) {
      EXPECT_EQ(o.partitions.size(), keys.size());
      for (const auto& [key, c] : o.partitions) EXPECT_EQ(c.freq_mhz, o.freq_mhz);
    }
  }
}

TEST(Compose, ClockWithoutOptionsIsSkipped) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  std::map<std::string, PartitionFronts> fronts;
  for (const auto& p : ps.partitions) fronts[p.key][1410] = {{{1410, 24, "norm"}, 1e-3, 0.3}};
  fronts["fwd_mlp"][1200] = {{{1200, 24, "norm"}, 1e-3, 0.2}};  // only one partition at 1200
  SegmentCostFn seg = [](const Segment&, int f) {
    return PartitionOption{{f, 0, "-"}, 1e-4, 0.01};
  };
  const auto got =
      compose_instruction(ps, 0, InstructionKind::kForward, fronts, seg, {{1410, 1200}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].freq_mhz, 1410);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// Per-instance composition: the Pareto set over every multiset of options (one per instance),
// by brute force over all multisets of a 3-option front for the forward instruction's two
// partitions (29 and 30 instances on stage 0).
TEST(Compose, PerInstanceMatchesBruteForceOverMultisets) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  std::map<std::string, PartitionFronts> fronts;
  const double t[3] = {1.0e-3, 1.3e-3, 1.5e-3}, e[3] = {0.50, 0.42, 0.31};
  for (const auto& p : ps.partitions) {
    for (int k = 0; k < 3; ++k) {
      fronts[p.key][1410].push_back({{1410, 3 + 3 * k, p.slots.front().name},
                                     t[k] * (p.key == "fwd_mlp" ? 1.7 : 1.0),
                                     e[k] * (p.key == "fwd_mlp" ? 1.3 : 1.0)});
    }
  }
  SegmentCostFn seg = [](const Segment&, int f) { return PartitionOption{{f, 0, "-"}, 0.0, 0.0}; };
  ComposeOptions co{{1410}, true};
  const auto got = compose_instruction(ps, 0, InstructionKind::kForward, fronts, seg, co);
  std::map<std::string, int> count;
  for (const auto& st : ps.instruction(0, InstructionKind::kForward).steps) {
    if (st.kind == Step::Kind::kPartition)
      ++count[ps.partitions[static_cast<std::size_t>(st.index)].key];
  }
  ASSERT_EQ(count.size(), 2u);
  // All (a, b, c) with a + b + c = n for each partition.
  auto multisets = [&](const std::string& key) {
    std::vector<std::pair<double, double>> out;
    const int n = count[key];
    const auto& f = fronts[key][1410];
    for (int a = 0; a <= n; ++a) {
      for (int b = 0; a + b <= n; ++b) {
        const int c = n - a - b;
        out.push_back(
            {a * f[0].time_s + b * f[1].time_s + c * f[2].time_s,
             a * f[0].dynamic_energy_j + b * f[1].dynamic_energy_j + c * f[2].dynamic_energy_j});
      }
    }
    return out;
  };
  const auto m1 = multisets("fwd_attn"), m2 = multisets("fwd_mlp");
  std::vector<Point2> all;
  for (const auto& x : m1) {
    for (const auto& y : m2) all.push_back({x.first + y.first, x.second + y.second});
  }
  // Sums taken in another order differ in the last bits, which can leave near-duplicates on one
  // side: compare within a tolerance. Every brute-force Pareto point is found, and every point
  // found is a brute-force point not beaten by more than the tolerance.
  const auto bf = pareto_front(all);
  const double tol = 1e-9;
  for (std::size_t b : bf) {
    bool found = false;
    for (const auto& g : got) {
      found |= std::abs(g.time_s - all[b].x) < tol && std::abs(g.dynamic_energy_j - all[b].y) < tol;
    }
    EXPECT_TRUE(found) << all[b].x << " " << all[b].y;
  }
  for (const auto& g : got) {
    for (std::size_t b : bf) {
      EXPECT_FALSE(all[b].x < g.time_s - tol && all[b].y < g.dynamic_energy_j - tol);
    }
    // The shares add up to the instance count.
    for (const auto& [key, shares] : g.mixes) {
      int total = 0;
      for (const auto& sh : shares) total += sh.instances;
      EXPECT_EQ(total, count[key]);
    }
  }
  // Uniform composition is contained: every uniform option is matched or dominated.
  co.per_instance = false;
  for (const auto& u : compose_instruction(ps, 0, InstructionKind::kForward, fronts, seg, co)) {
    bool covered = false;
    for (const auto& g : got)
      covered |= g.time_s <= u.time_s + 1e-12 && g.dynamic_energy_j <= u.dynamic_energy_j + 1e-12;
    EXPECT_TRUE(covered);
  }
}

}  // namespace
}  // namespace kareus
