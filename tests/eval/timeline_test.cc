// The timeline's data come straight from the plan's v2 times: one row per pipeline stage, each
// instruction's start, stall and end as the plan says; the picture is a real PNG.
#include "kareus/timeline.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "kareus/error.h"
#include "test_util.h"

namespace kareus {
namespace {

PlanInstruction instruction(InstructionKind kind, int mb, int freq, double start_s, double run_s,
                            bool clock_switch, double switch_s) {
  PlanInstruction in;
  in.kind = kind;
  in.microbatch = mb;
  in.freq_mhz = freq;
  in.start_s = start_s;
  in.time_s = run_s;
  in.clock_switch = clock_switch;
  in.end_s = start_s + (clock_switch ? switch_s : 0) + run_s;
  return in;
}

// Two stages, one micro-batch each way; stage 1 switches clock before its backward.
Plan two_stage_plan(bool overlapped) {
  Plan p;
  p.workload = "toy";
  p.method = overlapped ? "kareus" : "megatron";
  p.execution = overlapped ? ExecutionMode::kOverlapped : ExecutionMode::kSequential;
  p.clock_switch_s = 0.015;
  p.iteration_time_s = 1.0;
  p.energy_j = 5000;
  PlanStage s0, s1;
  s0.stage = 0;
  s1.stage = 1;
  s0.instructions = {instruction(InstructionKind::kForward, 0, 1410, 0.0, 0.2, false, 0.015),
                     instruction(InstructionKind::kBackward, 0, 1410, 0.6, 0.4, false, 0.015)};
  s1.instructions = {instruction(InstructionKind::kForward, 0, 1410, 0.21, 0.15, false, 0.015),
                     instruction(InstructionKind::kBackward, 0, 1200, 0.36, 0.22, true, 0.015)};
  s0.end_s = 1.0;
  s1.end_s = 0.595;
  if (overlapped) {
    PlanPartition a, b;
    a.sms = 12;
    b.sms = 6;
    for (auto* st : {&s0, &s1}) {
      for (auto& in : st->instructions) in.partitions = {{"fwd_attn", a}, {"fwd_mlp", b}};
    }
  }
  p.stages = {s0, s1};
  return p;
}

TEST(Timeline, OneRowPerStageWithThePlansTimes) {
  const Plan k = two_stage_plan(true), m = two_stage_plan(false);
  const auto j = timeline_data({{"Kareus", &k}, {"Megatron-LM", &m}});
  ASSERT_EQ(j.at("panels").size(), 2u);
  EXPECT_EQ(j.at("min_freq_mhz").get<int>(), 1200);
  EXPECT_EQ(j.at("max_freq_mhz").get<int>(), 1410);
  const auto& kp = j.at("panels")[0];
  EXPECT_EQ(kp.at("title"), "Kareus");
  EXPECT_EQ(kp.at("execution"), "overlapped");
  EXPECT_EQ(j.at("panels")[1].at("execution"), "sequential");
  ASSERT_EQ(kp.at("stages").size(), 2u);  // one row per pipeline stage
  for (std::size_t s = 0; s < 2; ++s) {
    const auto& row = kp.at("stages")[s];
    const PlanStage& st = k.stages[s];
    EXPECT_EQ(row.at("stage").get<int>(), st.stage);
    EXPECT_DOUBLE_EQ(row.at("end_s").get<double>(), st.end_s);
    ASSERT_EQ(row.at("instructions").size(), st.instructions.size());
    for (std::size_t i = 0; i < st.instructions.size(); ++i) {
      const auto& r = row.at("instructions")[i];
      const PlanInstruction& in = st.instructions[i];
      EXPECT_DOUBLE_EQ(r.at("start_s").get<double>(), in.start_s);
      EXPECT_DOUBLE_EQ(r.at("end_s").get<double>(), in.end_s);
      EXPECT_EQ(r.at("freq_mhz").get<int>(), in.freq_mhz);
      EXPECT_TRUE(r.at("overlapped").get<bool>());
      EXPECT_DOUBLE_EQ(r.at("collective_sms").get<double>(), 9.0);  // mean of 12 and 6
    }
  }
  // Stage 1's backward stalls 15 ms for its clock change, then runs 0.22 s.
  const auto& b1 = kp.at("stages")[1].at("instructions")[1];
  EXPECT_EQ(b1.at("label"), "B0");
  EXPECT_DOUBLE_EQ(b1.at("stall_s").get<double>(), 0.015);
  EXPECT_DOUBLE_EQ(b1.at("run_start_s").get<double>(), 0.375);
  EXPECT_DOUBLE_EQ(b1.at("end_s").get<double>(), 0.595);
  const auto& f0 = kp.at("stages")[0].at("instructions")[0];
  EXPECT_EQ(f0.at("label"), "F0");
  EXPECT_DOUBLE_EQ(f0.at("stall_s").get<double>(), 0.0);
  EXPECT_FALSE(j.at("panels")[1].at("stages")[0].at("instructions")[0].at("overlapped"));
  EXPECT_THROW(timeline_data({}), InvalidInput);
  EXPECT_THROW(timeline_data({{"none", nullptr}}), InvalidInput);
}

TEST(Timeline, DrawsAPngWithItsDataBeside) {
  test::TempDir tmp;
  const Plan k = two_stage_plan(true), m = two_stage_plan(false);
  std::string error;
  const std::string png = tmp.file("t.timeline.png");
  ASSERT_TRUE(plot_timeline({{"Kareus", &k}, {"Megatron-LM", &m}}, png, error)) << error;
  const std::string bytes = test::read_file(png);
  ASSERT_GT(bytes.size(), 5000u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  const auto data = nlohmann::json::parse(test::read_file(tmp.file("t.timeline.data.json")));
  EXPECT_EQ(data.at("panels")[0].at("stages").size(), 2u);
  // The script written beside it is the repository's file, byte for byte.
  bool found = false;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) {
    if (e.path().extension() != ".py") continue;
    found = true;
    EXPECT_EQ(test::read_file(e.path().string()),
              test::read_file(test::source_path("src/eval/plot_timeline.py")));
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace kareus
