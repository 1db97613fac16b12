// The pipeline schedules against hand-written orders, Megatron-LM's interleaved order for
// p = 4, v = 2, m = 8 (Narayanan et al., SC '21, Figure 4), and the ideal bubble formula.
#include "kareus/schedule.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "kareus/error.h"

namespace kareus {
namespace {

// "F0.1" is the forward of micro-batch 1 through chunk 0; "B1.0" a backward.
std::vector<std::string> names(const std::vector<ScheduledInstruction>& o) {
  std::vector<std::string> out;
  for (const auto& x : o) {
    out.push_back(fmt::format("{}{}.{}", x.kind == InstructionKind::kForward ? 'F' : 'B', x.chunk,
                              x.microbatch));
  }
  return out;
}

TEST(Schedule, OneFOneBHandWritten) {
  const Schedule s(2, 1, 3);
  EXPECT_STREQ(s.name(), "1f1b");
  EXPECT_EQ(names(s.order(0)),
            (std::vector<std::string>{"F0.0", "F0.1", "B0.0", "F0.2", "B0.1", "B0.2"}));
  EXPECT_EQ(names(s.order(1)),
            (std::vector<std::string>{"F0.0", "B0.0", "F0.1", "B0.1", "F0.2", "B0.2"}));
  EXPECT_EQ(s.warmup(0), 1);
  EXPECT_EQ(s.warmup(1), 0);
  // Fewer micro-batches than stages: the warm-up is capped.
  const Schedule few(4, 1, 2);
  EXPECT_EQ(names(few.order(0)), (std::vector<std::string>{"F0.0", "F0.1", "B0.0", "B0.1"}));
  EXPECT_EQ(few.max_in_flight(0), 2);
  EXPECT_EQ(Schedule(4, 1, 8).max_in_flight(0), 4);
  EXPECT_EQ(Schedule(4, 1, 8).max_in_flight(3), 1);
}

TEST(Schedule, InterleavedMatchesMegatronFigure4) {
  const Schedule s(4, 2, 8);
  EXPECT_STREQ(s.name(), "interleaved-1f1b");
  // Device 1 of the figure: chunk 0 of micro-batches 0-3, chunk 1 of 0-3, chunk 0 of 4-5 as
  // warm-up ((4 - 0 - 1) * 2 + (2 - 1) * 4 = 10), then 1F1B, backwards through chunk 1 first.
  EXPECT_EQ(s.warmup(0), 10);
  EXPECT_EQ(
      names(s.order(0)),
      (std::vector<std::string>{"F0.0", "F0.1", "F0.2", "F0.3", "F1.0", "F1.1", "F1.2", "F1.3",
                                "F0.4", "F0.5", "F0.6", "B1.0", "F0.7", "B1.1", "F1.4", "B1.2",
                                "F1.5", "B1.3", "F1.6", "B0.0", "F1.7", "B0.1", "B0.2", "B0.3",
                                "B1.4", "B1.5", "B1.6", "B1.7", "B0.4", "B0.5", "B0.6", "B0.7"}));
  // Device 4: four warm-up forwards, then strict alternation.
  EXPECT_EQ(s.warmup(3), 4);
  EXPECT_EQ(
      names(s.order(3)),
      (std::vector<std::string>{"F0.0", "F0.1", "F0.2", "F0.3", "F1.0", "B1.0", "F1.1", "B1.1",
                                "F1.2", "B1.2", "F1.3", "B1.3", "F0.4", "B0.0", "F0.5", "B0.1",
                                "F0.6", "B0.2", "F0.7", "B0.3", "F1.4", "B1.4", "F1.5", "B1.5",
                                "F1.6", "B1.6", "F1.7", "B1.7", "B0.4", "B0.5", "B0.6", "B0.7"}));
  EXPECT_EQ(s.virtual_stage(1, 1), 5);
  EXPECT_EQ(s.stage_of(5), 1);
  EXPECT_EQ(s.chunk_of(5), 1);
  // m == p: every forward first (Megatron-LM's all-warm-up case).
  const Schedule full(2, 2, 2);
  EXPECT_EQ(full.warmup(0), 4);
  EXPECT_EQ(names(full.order(1)), (std::vector<std::string>{"F0.0", "F0.1", "F1.0", "F1.1", "B1.0",
                                                            "B1.1", "B0.0", "B0.1"}));
}

TEST(Schedule, EveryOrderRunsEachPassOnceAndBackwardAfterItsForward) {
  for (const auto& [p, v, m] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {1, 1, 5}, {3, 1, 2}, {4, 1, 9}, {2, 2, 4}, {4, 3, 8}, {8, 5, 32}}) {
    const Schedule s(p, v, m);
    for (int st = 0; st < p; ++st) {
      std::map<std::tuple<int, int, int>, int> seen;
      for (const auto& x : s.order(st)) {
        if (x.kind == InstructionKind::kBackward) {
          EXPECT_EQ(seen.count({0, x.chunk, x.microbatch}), 1u) << p << " " << v << " " << m;
        }
        ++seen[{static_cast<int>(x.kind), x.chunk, x.microbatch}];
      }
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(2 * v * m));
      for (const auto& [k, n] : seen) EXPECT_EQ(n, 1);
    }
  }
}

// Longest path through the schedule with forward time tf and backward time tb per chunk pass
// and free messages: the ideal pipeline of the bubble formula.
double ideal_makespan(const Schedule& s, double tf, double tb) {
  const int p = s.stages();
  std::map<std::tuple<int, int, int>, double> end;  // (kind, virtual stage, mb)
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> clock(static_cast<std::size_t>(p), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      auto& n = next[static_cast<std::size_t>(st)];
      while (n < s.order(st).size()) {
        const auto& x = s.order(st)[n];
        const InstructionRef me{x.kind, s.virtual_stage(st, x.chunk), x.microbatch};
        double ready = clock[static_cast<std::size_t>(st)];
        InstructionRef from;
        if (s.input_of(me, &from)) {
          auto it = end.find({static_cast<int>(from.kind), from.virtual_stage, from.microbatch});
          if (it == end.end()) break;
          ready = std::max(ready, it->second);
        }
        const double e = ready + (x.kind == InstructionKind::kForward ? tf : tb);
        end[{static_cast<int>(x.kind), me.virtual_stage, me.microbatch}] = e;
        clock[static_cast<std::size_t>(st)] = e;
        ++n;
        progress = true;
      }
    }
  }
  for (int st = 0; st < p; ++st) EXPECT_EQ(next[static_cast<std::size_t>(st)], s.order(st).size());
  return *std::max_element(clock.begin(), clock.end());
}

TEST(Schedule, IdealBubbleIsPMinusOneOverVM) {
  for (const auto& [p, v, m] : std::vector<std::tuple<int, int, int>>{
           {4, 1, 8}, {4, 2, 8}, {8, 2, 32}, {8, 5, 32}, {16, 4, 16}, {16, 4, 32}}) {
    const Schedule s(p, v, m);
    const double tf = 1.0 / v, tb = 2.0 / v;  // a stage's layers split evenly over its chunks
    const double compute = v * m * (tf + tb);
    const double bubble = ideal_makespan(s, tf, tb) / compute - 1.0;
    EXPECT_NEAR(bubble, s.bubble_fraction(), 0.01 * s.bubble_fraction())
        << "p=" << p << " v=" << v << " m=" << m;
    EXPECT_DOUBLE_EQ(s.bubble_fraction(), (p - 1.0) / (v * m));
  }
}

TEST(Schedule, RefusesWhatMegatronRefuses) {
  EXPECT_THROW(Schedule(4, 2, 6), InvalidInput);  // m not a multiple of p
  EXPECT_THROW(Schedule(1, 2, 4), InvalidInput);  // chunks without a pipeline
  EXPECT_THROW(Schedule(0, 1, 4), InvalidInput);
  EXPECT_THROW(Schedule(2, 1, 0), InvalidInput);
  try {
    Schedule(4, 2, 6);
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the pipeline stages (4)"), std::string::npos);
  }
}

}  // namespace
}  // namespace kareus
