// The C API (include/kareus/c_api.h) called as a C program would: status codes, the thread-local
// last-error text, the rank -> stage mapping, instruction settings against the plan JSON read
// independently, the order check of the instruction hooks (synchronous and interleaved 1F1B
// plans), the schedule's order against hand-written lists, and the clocks an attached dry-run
// controller receives.
#include "kareus/c_api.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fakes/fake_nvml_util.h"
#include "test_util.h"

namespace kareus {
namespace {

const std::string kWorkload = "tests/runtime/data/tiny_tp2_pp2.yaml";

/// One min-energy plan for the tiny TP=2, PP=2 workload, made by the CLI once for the suite.
/// Clock switches are free in it (the paper's model): this workload's instructions last well
/// under a switch, and these tests need a plan that changes clocks.
class CApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const auto r = test::run_cli("plan " + test::source_path(kWorkload) +
                                 " --min-energy --no-fallback --clock-switch-ms 0 --out " +
                                 dir_->file("plan.json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json_ = new nlohmann::json(nlohmann::json::parse(test::read_file(dir_->file("plan.json"))));
  }
  static void TearDownTestSuite() {
    delete json_;
    delete dir_;
  }
  static std::string plan_path() { return dir_->file("plan.json"); }
  static std::string workload() { return test::source_path(kWorkload); }
  static const nlohmann::json& plan_json() { return *json_; }

  kareus_plan* open(int rank) {
    kareus_plan* p = nullptr;
    EXPECT_EQ(kareus_plan_open(plan_path().c_str(), workload().c_str(), rank, &p), KAREUS_OK)
        << kareus_last_error();
    return p;
  }

  static test::TempDir* dir_;
  static nlohmann::json* json_;
};
test::TempDir* CApi::dir_ = nullptr;
nlohmann::json* CApi::json_ = nullptr;

TEST_F(CApi, OpenFailuresReturnCodesAndNameTheProblem) {
  kareus_plan* p = reinterpret_cast<kareus_plan*>(0x1);
  EXPECT_EQ(kareus_plan_open("/no/such/plan.json", workload().c_str(), 0, &p),
            KAREUS_ERR_INVALID_INPUT);
  EXPECT_EQ(p, nullptr) << "out is cleared on failure";
  EXPECT_NE(std::string(kareus_last_error()).find("/no/such/plan.json"), std::string::npos)
      << kareus_last_error();

  EXPECT_EQ(kareus_plan_open(plan_path().c_str(), workload().c_str(), 0, nullptr),
            KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("'out' is NULL"), std::string::npos)
      << kareus_last_error();
  EXPECT_EQ(kareus_plan_open(nullptr, workload().c_str(), 0, &p), KAREUS_ERR_ARGUMENT);

  // Rank 4 of a 4-GPU job.
  EXPECT_EQ(kareus_plan_open(plan_path().c_str(), workload().c_str(), 4, &p),
            KAREUS_ERR_INVALID_INPUT);
  EXPECT_NE(std::string(kareus_last_error()).find("rank 4"), std::string::npos)
      << kareus_last_error();

  // A plan for another workload: refused, naming the digest field.
  const std::string other = test::source_path("workloads/examples/custom_model.yaml");
  EXPECT_EQ(kareus_plan_open(plan_path().c_str(), other.c_str(), 0, &p), KAREUS_ERR_INVALID_INPUT);
  EXPECT_NE(std::string(kareus_last_error()).find("workload.digest"), std::string::npos)
      << kareus_last_error();

  // A damaged plan: an SM count out of range names the field.
  auto j = plan_json();
  j["stages"][0]["instructions"][0]["partitions"]["fwd_attn"]["sms"] = 99;
  const std::string bad = dir_->write("bad.json", j.dump());
  EXPECT_EQ(kareus_plan_open(bad.c_str(), workload().c_str(), 0, &p), KAREUS_ERR_INVALID_INPUT);
  EXPECT_NE(std::string(kareus_last_error()).find("sms"), std::string::npos) << kareus_last_error();
  EXPECT_STREQ(kareus_status_name(KAREUS_ERR_INVALID_INPUT), "KAREUS_ERR_INVALID_INPUT");
  EXPECT_STREQ(kareus_status_name(42), "unknown");
}

TEST_F(CApi, RankMappingAndInstructionsMatchThePlanJson) {
  for (int rank = 0; rank < 4; ++rank) {
    kareus_plan* p = open(rank);
    ASSERT_NE(p, nullptr);
    int stage = -1, stages = 0, ranks = 0;
    ASSERT_EQ(kareus_plan_stage(p, &stage), KAREUS_OK);
    EXPECT_EQ(stage, rank / 2) << "Megatron order: tp fastest, 2 ranks per stage";
    ASSERT_EQ(kareus_plan_num_stages(p, &stages), KAREUS_OK);
    ASSERT_EQ(kareus_plan_num_ranks(p, &ranks), KAREUS_OK);
    EXPECT_EQ(stages, 2);
    EXPECT_EQ(ranks, 4);
    int buf[4] = {-1, -1, -1, -1}, count = 0;
    ASSERT_EQ(kareus_plan_stage_ranks(p, stage, buf, 4, &count), KAREUS_OK);
    ASSERT_EQ(count, 2);
    EXPECT_EQ(buf[0], 2 * stage);
    EXPECT_EQ(buf[1], 2 * stage + 1);

    const auto& ins = plan_json()["stages"][static_cast<std::size_t>(stage)]["instructions"];
    int n = 0;
    ASSERT_EQ(kareus_plan_instruction_count(p, &n), KAREUS_OK);
    ASSERT_EQ(static_cast<std::size_t>(n), ins.size());
    for (int i = 0; i < n; ++i) {
      const auto& want = ins[static_cast<std::size_t>(i)];
      kareus_instruction_info info;
      ASSERT_EQ(kareus_plan_instruction(p, i, &info), KAREUS_OK) << kareus_last_error();
      EXPECT_EQ(info.kind, want["instruction"] == "forward" ? KAREUS_FORWARD : KAREUS_BACKWARD);
      EXPECT_EQ(info.microbatch, want["microbatch"].get<int>());
      EXPECT_EQ(info.chunk, 0);
      EXPECT_EQ(info.freq_mhz, want["freq_mhz"].get<int>());
      EXPECT_DOUBLE_EQ(info.start_s, want["start_s"].get<double>());
      ASSERT_EQ(static_cast<std::size_t>(info.partition_count), want["partitions"].size());
      for (int k = 0; k < info.partition_count; ++k) {
        kareus_partition_info pi;
        ASSERT_EQ(kareus_plan_partition(p, i, k, &pi), KAREUS_OK) << kareus_last_error();
        const auto& wp = want["partitions"][pi.key];
        EXPECT_EQ(pi.sms, wp["sms"].get<int>());
        EXPECT_EQ(std::string(pi.slot), wp["slot"].get<std::string>());
        EXPECT_EQ(std::string(pi.slot_op), wp["launch_before"]["op"].get<std::string>());
        EXPECT_EQ(pi.slot_op_index, wp["launch_before"]["index"].get<int>());
        // Independent of the plan file: the recomputed blocks are the forward partitions of a
        // backward instruction (the workload recomputes fully).
        const bool fwd_key = std::string(pi.key).rfind("fwd_", 0) == 0;
        EXPECT_EQ(pi.recompute != 0, fwd_key && info.kind == KAREUS_BACKWARD) << pi.key;
        EXPECT_EQ(pi.mix_count, 0);
      }
      int found = -1;
      ASSERT_EQ(kareus_plan_find_instruction(p, info.kind, info.microbatch, &found), KAREUS_OK);
      EXPECT_EQ(found, i);
      ASSERT_EQ(kareus_plan_find_instruction_chunk(p, info.kind, 0, info.microbatch, &found),
                KAREUS_OK);
      EXPECT_EQ(found, i);
    }
    int chunks = 0;
    ASSERT_EQ(kareus_plan_chunks(p, &chunks), KAREUS_OK);
    EXPECT_EQ(chunks, 1);
    const char* schedule = nullptr;
    ASSERT_EQ(kareus_plan_schedule_name(p, &schedule), KAREUS_OK);
    EXPECT_STREQ(schedule, "1f1b");
    int layers = 0, first_layer = -1;
    ASSERT_EQ(kareus_plan_chunk_layers(p, 0, &layers, &first_layer), KAREUS_OK);
    EXPECT_EQ(layers, 1);
    EXPECT_EQ(first_layer, stage);
    kareus_workload_shape w;
    ASSERT_EQ(kareus_plan_workload_shape(p, &w), KAREUS_OK);
    EXPECT_EQ(w.hidden, 64);
    EXPECT_EQ(w.tp, 2);
    EXPECT_EQ(w.pp, 2);
    EXPECT_EQ(w.micro_batches, 4);
    EXPECT_EQ(w.stage_layers, 1);
    EXPECT_EQ(w.recompute, 1);
    EXPECT_EQ(w.virtual_pipeline, 1);
    kareus_plan_close(p);
  }
}

TEST_F(CApi, QueriesOutOfRangeAreArgumentErrors) {
  kareus_plan* p = open(0);
  ASSERT_NE(p, nullptr);
  kareus_instruction_info info;
  EXPECT_EQ(kareus_plan_instruction(p, 8, &info), KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("instruction index 8"), std::string::npos)
      << kareus_last_error();
  kareus_partition_info pi;
  EXPECT_EQ(kareus_plan_partition(p, 0, 17, &pi), KAREUS_ERR_ARGUMENT);
  kareus_mix_info mi;
  EXPECT_EQ(kareus_plan_partition_mix(p, 0, 0, 0, &mi), KAREUS_ERR_ARGUMENT);
  int index = 0;
  EXPECT_EQ(kareus_plan_find_instruction(p, 7, 0, &index), KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("kind 7"), std::string::npos);
  EXPECT_EQ(kareus_plan_find_instruction(p, KAREUS_FORWARD, 9, &index), KAREUS_ERR_ARGUMENT);
  EXPECT_EQ(kareus_plan_find_instruction_chunk(p, KAREUS_FORWARD, 1, 0, &index),
            KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("chunk 1: the plan's stages hold 1 model chunk"),
            std::string::npos)
      << kareus_last_error();
  EXPECT_EQ(kareus_instruction_begin_chunk(p, KAREUS_FORWARD, 1, 0), KAREUS_ERR_ARGUMENT);
  EXPECT_EQ(kareus_plan_chunk_layers(p, 1, nullptr, nullptr), KAREUS_ERR_ARGUMENT);
  int stage = 0;
  EXPECT_EQ(kareus_plan_stage_of_rank(p, 3, &stage), KAREUS_OK);
  EXPECT_EQ(stage, 1);
  EXPECT_EQ(kareus_plan_stage_of_rank(p, -1, &stage), KAREUS_ERR_INVALID_INPUT);
  EXPECT_EQ(kareus_plan_stage(nullptr, &stage), KAREUS_ERR_ARGUMENT);
  kareus_plan_close(p);
  kareus_plan_close(nullptr);
}

TEST_F(CApi, HooksEnforceThePlansOrderAndWrapAround) {
  kareus_plan* p = open(0);  // stage 0: F0 F1 B0 F2 B1 F3 B2 B3
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(kareus_instruction_end(p, KAREUS_FORWARD, 0), KAREUS_ERR_ORDER) << "end before begin";
  EXPECT_NE(std::string(kareus_last_error()).find("without a begin"), std::string::npos);
  EXPECT_EQ(kareus_instruction_begin(p, KAREUS_BACKWARD, 0), KAREUS_ERR_ORDER);
  EXPECT_NE(std::string(kareus_last_error())
                .find("the plan's 1f1b order runs forward of micro-batch 0 (chunk 0)"),
            std::string::npos)
      << kareus_last_error();
  ASSERT_EQ(kareus_instruction_begin(p, KAREUS_FORWARD, 0), KAREUS_OK) << kareus_last_error();
  EXPECT_EQ(kareus_instruction_begin(p, KAREUS_FORWARD, 1), KAREUS_ERR_ORDER) << "nested begin";
  EXPECT_EQ(kareus_instruction_end(p, KAREUS_FORWARD, 1), KAREUS_ERR_ORDER) << "wrong end";
  int next = -1, is_open = -1;
  ASSERT_EQ(kareus_plan_position(p, &next, &is_open), KAREUS_OK);
  EXPECT_EQ(next, 0);
  EXPECT_EQ(is_open, 1) << "failed calls change nothing";
  ASSERT_EQ(kareus_instruction_end(p, KAREUS_FORWARD, 0), KAREUS_OK);
  EXPECT_EQ(kareus_instruction_begin(p, 2, 1), KAREUS_ERR_ARGUMENT);

  const std::vector<std::pair<int, int>> order = {
      {KAREUS_FORWARD, 1}, {KAREUS_BACKWARD, 0}, {KAREUS_FORWARD, 2},  {KAREUS_BACKWARD, 1},
      {KAREUS_FORWARD, 3}, {KAREUS_BACKWARD, 2}, {KAREUS_BACKWARD, 3}, {KAREUS_FORWARD, 0}};
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto [kind, mb] = order[i];
    if (i % 2) {  // the chunk-0 forms and the _chunk forms with chunk 0 are the same hooks
      ASSERT_EQ(kareus_instruction_begin_chunk(p, kind, 0, mb), KAREUS_OK) << kareus_last_error();
      ASSERT_EQ(kareus_instruction_end_chunk(p, kind, 0, mb), KAREUS_OK) << kareus_last_error();
    } else {
      ASSERT_EQ(kareus_instruction_begin(p, kind, mb), KAREUS_OK) << kareus_last_error();
      ASSERT_EQ(kareus_instruction_end(p, kind, mb), KAREUS_OK) << kareus_last_error();
    }
  }
  ASSERT_EQ(kareus_plan_position(p, &next, &is_open), KAREUS_OK);
  EXPECT_EQ(next, 1) << "the second iteration continues after its first forward";
  ASSERT_EQ(kareus_plan_reset_position(p), KAREUS_OK);
  EXPECT_EQ(kareus_instruction_begin(p, KAREUS_FORWARD, 0), KAREUS_OK);
  kareus_plan_close(p);
}

using Order = std::vector<std::tuple<int, int, int>>;  // (kind, chunk, microbatch)
constexpr int F = KAREUS_FORWARD, B = KAREUS_BACKWARD;

// Interleaved 1F1B for p = 2 stages, v = 2 chunks, m = 4 micro-batches, written out by hand
// from Megatron-LM's rule (forward pass k is chunk (k mod 4) / 2 of micro-batch 2 (k / 4) +
// k mod 2, backwards take the chunks in reverse; warm-up (p - s - 1) * 2 + (v - 1) * p).
const Order kInterleaved[2] = {{{F, 0, 0},
                                {F, 0, 1},
                                {F, 1, 0},
                                {F, 1, 1},
                                {F, 0, 2},
                                {B, 1, 0},
                                {F, 0, 3},
                                {B, 1, 1},
                                {F, 1, 2},
                                {B, 0, 0},
                                {F, 1, 3},
                                {B, 0, 1},
                                {B, 1, 2},
                                {B, 1, 3},
                                {B, 0, 2},
                                {B, 0, 3}},
                               {{F, 0, 0},
                                {F, 0, 1},
                                {F, 1, 0},
                                {B, 1, 0},
                                {F, 1, 1},
                                {B, 1, 1},
                                {F, 0, 2},
                                {B, 0, 0},
                                {F, 0, 3},
                                {B, 0, 1},
                                {F, 1, 2},
                                {B, 1, 2},
                                {F, 1, 3},
                                {B, 1, 3},
                                {B, 0, 2},
                                {B, 0, 3}}};

Order schedule_order(int stages, int chunks, int mbs, int stage) {
  int n = 0;
  EXPECT_EQ(kareus_schedule_order(stages, chunks, mbs, stage, nullptr, 0, &n), KAREUS_OK)
      << kareus_last_error();
  std::vector<kareus_scheduled_instruction> buf(static_cast<std::size_t>(n));
  EXPECT_EQ(kareus_schedule_order(stages, chunks, mbs, stage, buf.data(), n, &n), KAREUS_OK);
  Order out;
  for (const auto& x : buf) out.emplace_back(x.kind, x.chunk, x.microbatch);
  return out;
}

TEST(CApiSchedule, OrdersAreTheSchedulesAgainstHandWrittenLists) {
  EXPECT_EQ(schedule_order(2, 2, 4, 0), kInterleaved[0]);
  EXPECT_EQ(schedule_order(2, 2, 4, 1), kInterleaved[1]);
  const Order one_f_one_b = {{F, 0, 0}, {F, 0, 1}, {B, 0, 0}, {F, 0, 2},
                             {B, 0, 1}, {F, 0, 3}, {B, 0, 2}, {B, 0, 3}};
  EXPECT_EQ(schedule_order(2, 1, 4, 0), one_f_one_b);
  const char* name = nullptr;
  ASSERT_EQ(kareus_schedule_name(2, 2, 4, &name), KAREUS_OK);
  EXPECT_STREQ(name, "interleaved-1f1b");
  ASSERT_EQ(kareus_schedule_name(2, 1, 4, &name), KAREUS_OK);
  EXPECT_STREQ(name, "1f1b");

  // A short buffer gets the first entries and the full count.
  kareus_scheduled_instruction two[2] = {};
  int n = 0;
  ASSERT_EQ(kareus_schedule_order(2, 2, 4, 1, two, 2, &n), KAREUS_OK);
  EXPECT_EQ(n, 16);
  EXPECT_EQ(two[1].kind, F);
  EXPECT_EQ(two[1].chunk, 0);
  EXPECT_EQ(two[1].microbatch, 1);

  EXPECT_EQ(kareus_schedule_order(2, 2, 3, 0, nullptr, 0, &n), KAREUS_ERR_INVALID_INPUT);
  EXPECT_NE(std::string(kareus_last_error()).find("multiple of the pipeline stages"),
            std::string::npos)
      << kareus_last_error();
  EXPECT_EQ(kareus_schedule_order(2, 2, 4, 2, nullptr, 0, &n), KAREUS_ERR_ARGUMENT);
  EXPECT_EQ(kareus_schedule_order(2, 2, 4, 0, nullptr, 1, &n), KAREUS_ERR_ARGUMENT);
}

/// A plan of the interleaved tiny workload (2 chunks per stage), made by the CLI.
class CApiInterleaved : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const auto r = test::run_cli("plan " + workload() +
                                 " --min-energy --no-fallback --clock-switch-ms 0 --out " +
                                 dir_->file("plan.json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json_ = new nlohmann::json(nlohmann::json::parse(test::read_file(dir_->file("plan.json"))));
  }
  static void TearDownTestSuite() {
    delete json_;
    delete dir_;
  }
  static std::string workload() {
    return test::source_path("tests/runtime/data/tiny_tp2_pp2_vp2.yaml");
  }
  kareus_plan* open(int rank) {
    kareus_plan* p = nullptr;
    EXPECT_EQ(kareus_plan_open(dir_->file("plan.json").c_str(), workload().c_str(), rank, &p),
              KAREUS_OK)
        << kareus_last_error();
    return p;
  }
  static test::TempDir* dir_;
  static nlohmann::json* json_;
};
test::TempDir* CApiInterleaved::dir_ = nullptr;
nlohmann::json* CApiInterleaved::json_ = nullptr;

TEST_F(CApiInterleaved, InstructionsCarryTheirChunkInTheInterleavedOrder) {
  EXPECT_EQ((*json_)["parallel"]["virtual_pipeline"].get<int>(), 2);
  for (int rank = 0; rank < 4; ++rank) {
    kareus_plan* p = open(rank);
    ASSERT_NE(p, nullptr);
    const int stage = rank / 2;
    int chunks = 0;
    ASSERT_EQ(kareus_plan_chunks(p, &chunks), KAREUS_OK);
    EXPECT_EQ(chunks, 2);
    const char* schedule = nullptr;
    ASSERT_EQ(kareus_plan_schedule_name(p, &schedule), KAREUS_OK);
    EXPECT_STREQ(schedule, "interleaved-1f1b");
    int n = 0;
    ASSERT_EQ(kareus_plan_instruction_count(p, &n), KAREUS_OK);
    Order got;
    const auto& ins = (*json_)["stages"][static_cast<std::size_t>(stage)]["instructions"];
    ASSERT_EQ(static_cast<std::size_t>(n), ins.size());
    for (int i = 0; i < n; ++i) {
      kareus_instruction_info info{};
      ASSERT_EQ(kareus_plan_instruction(p, i, &info), KAREUS_OK) << kareus_last_error();
      got.emplace_back(info.kind, info.chunk, info.microbatch);
      EXPECT_EQ(info.chunk, ins[static_cast<std::size_t>(i)]["chunk"].get<int>());
      EXPECT_EQ(info.freq_mhz, ins[static_cast<std::size_t>(i)]["freq_mhz"].get<int>());
      int found = -1;
      ASSERT_EQ(
          kareus_plan_find_instruction_chunk(p, info.kind, info.chunk, info.microbatch, &found),
          KAREUS_OK)
          << kareus_last_error();
      EXPECT_EQ(found, i);
    }
    EXPECT_EQ(got, kInterleaved[stage]) << "rank " << rank;

    // One layer per virtual stage: chunk c of stage s is layer c * 2 + s.
    for (int c = 0; c < 2; ++c) {
      int layers = 0, first_layer = -1;
      ASSERT_EQ(kareus_plan_chunk_layers(p, c, &layers, &first_layer), KAREUS_OK);
      EXPECT_EQ(layers, 1);
      EXPECT_EQ(first_layer, c * 2 + stage);
    }
    kareus_workload_shape w{};
    ASSERT_EQ(kareus_plan_workload_shape(p, &w), KAREUS_OK);
    EXPECT_EQ(w.virtual_pipeline, 2);
    EXPECT_EQ(w.stage_layers, 2) << "both chunks of the stage";
    EXPECT_EQ(w.layers, 4);
    kareus_plan_close(p);
  }
}

TEST_F(CApiInterleaved, HooksFollowTheInterleavedOrderAndRefuseAWrongChunk) {
  kareus_plan* p = open(2);  // stage 1
  ASSERT_NE(p, nullptr);
  const Order& order = kInterleaved[1];
  for (int round = 0; round < 2; ++round) {  // wraps around into a second iteration
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto [kind, chunk, mb] = order[i];
      if (i == 2) {
        // F(chunk 1, mb 0) is next: the same kind and micro-batch through the wrong chunk.
        EXPECT_EQ(kareus_instruction_begin_chunk(p, F, 0, 0), KAREUS_ERR_ORDER);
        const std::string err = kareus_last_error();
        EXPECT_NE(err.find("begin of forward of micro-batch 0 (chunk 0), but the plan's "
                           "interleaved-1f1b order runs forward of micro-batch 0 (chunk 1) "
                           "(instruction 2 of 16) next"),
                  std::string::npos)
            << err;
        EXPECT_NE(err.find("kareus_instruction_begin_chunk"), std::string::npos) << err;
        int next = -1, is_open = -1;
        ASSERT_EQ(kareus_plan_position(p, &next, &is_open), KAREUS_OK);
        EXPECT_EQ(next, 2) << "a refused call changes nothing";
        EXPECT_EQ(is_open, 0);
      }
      ASSERT_EQ(kareus_instruction_begin_chunk(p, kind, chunk, mb), KAREUS_OK)
          << "instruction " << i << ": " << kareus_last_error();
      if (i == 3) {  // B(chunk 1, mb 0) is open: ending it through chunk 0 is refused
        EXPECT_EQ(kareus_instruction_end_chunk(p, B, 0, 0), KAREUS_ERR_ORDER);
        EXPECT_NE(std::string(kareus_last_error())
                      .find("end of backward of micro-batch 0 (chunk 0), but the open "
                            "instruction is backward of micro-batch 0 (chunk 1)"),
                  std::string::npos)
            << kareus_last_error();
      }
      ASSERT_EQ(kareus_instruction_end_chunk(p, kind, chunk, mb), KAREUS_OK)
          << "instruction " << i << ": " << kareus_last_error();
    }
    int next = -1, is_open = -1;
    ASSERT_EQ(kareus_plan_position(p, &next, &is_open), KAREUS_OK);
    EXPECT_EQ(next, 0);
  }
  EXPECT_EQ(kareus_instruction_begin_chunk(p, F, 2, 0), KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("chunk 2: the plan's stages hold 2 model chunks"),
            std::string::npos)
      << kareus_last_error();
  kareus_plan_close(p);
}

TEST_F(CApiInterleaved, ChunklessFormsAreRefusedNamingTheChunkFunction) {
  kareus_plan* p = open(0);
  ASSERT_NE(p, nullptr);
  // Even the instruction that is next (forward of micro-batch 0, chunk 0) is ambiguous here.
  EXPECT_EQ(kareus_instruction_begin(p, F, 0), KAREUS_ERR_ORDER);
  std::string err = kareus_last_error();
  EXPECT_NE(err.find("call kareus_instruction_begin_chunk"), std::string::npos) << err;
  EXPECT_NE(err.find("interleaved-1f1b schedule with 2 model chunks"), std::string::npos) << err;
  EXPECT_NE(err.find("next in the plan: forward of micro-batch 0 (chunk 0)"), std::string::npos)
      << err;
  int next = -1, is_open = -1;
  ASSERT_EQ(kareus_plan_position(p, &next, &is_open), KAREUS_OK);
  EXPECT_EQ(is_open, 0);
  ASSERT_EQ(kareus_instruction_begin_chunk(p, F, 0, 0), KAREUS_OK) << kareus_last_error();
  EXPECT_EQ(kareus_instruction_end(p, F, 0), KAREUS_ERR_ORDER);
  EXPECT_NE(std::string(kareus_last_error()).find("call kareus_instruction_end_chunk"),
            std::string::npos)
      << kareus_last_error();
  ASSERT_EQ(kareus_instruction_end_chunk(p, F, 0, 0), KAREUS_OK) << kareus_last_error();
  int index = -1;
  EXPECT_EQ(kareus_plan_find_instruction(p, B, 0, &index), KAREUS_ERR_ORDER);
  EXPECT_NE(std::string(kareus_last_error()).find("call kareus_plan_find_instruction_chunk"),
            std::string::npos)
      << kareus_last_error();
  ASSERT_EQ(kareus_plan_find_instruction_chunk(p, B, 0, 0, &index), KAREUS_OK);
  EXPECT_EQ(index, 9);  // kInterleaved[0][9] is B(chunk 0, mb 0)
  kareus_plan_close(p);
}

TEST_F(CApi, LastErrorIsPerThread) {
  int stage = 0;
  ASSERT_EQ(kareus_plan_stage(nullptr, &stage), KAREUS_ERR_ARGUMENT);
  const std::string mine = kareus_last_error();
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = kareus_last_error();
    kareus_plan* p = nullptr;
    (void)kareus_plan_open("/no/such/other.json", "/no/such.yaml", 0, &p);
    other_after = kareus_last_error();
  });
  t.join();
  EXPECT_EQ(other_before, "") << "a new thread starts without an error";
  EXPECT_NE(other_after.find("/no/such"), std::string::npos) << other_after;
  EXPECT_EQ(std::string(kareus_last_error()), mine) << "another thread's failure leaves ours";
  EXPECT_NE(mine.find("kareus_plan_stage"), std::string::npos) << "names the function: " << mine;
}

TEST_F(CApi, AttachedControllerReceivesTheStagesClocks) {
  test::TempDir dir;
  const std::string log = dir.file("freqd.jsonl");
  kareus_controller_options o{};
  o.gpu_index = 1;
  o.dry_run = 1;
  o.log_path = log.c_str();
  o.executable = KAREUS_FREQD;
  kareus_controller* c = nullptr;
  ASSERT_EQ(kareus_controller_start_ex(&o, &c), KAREUS_OK) << kareus_last_error();
  int pid = 0;
  ASSERT_EQ(kareus_controller_pid(c, &pid), KAREUS_OK);
  EXPECT_GT(pid, 0);

  // The stage whose clock changes most often, through its second rank.
  std::size_t stage = 0, most = 0;
  for (std::size_t s = 0; s < plan_json()["stages"].size(); ++s) {
    std::size_t changes = 0;
    int last = -1;
    for (const auto& in : plan_json()["stages"][s]["instructions"]) {
      changes += in["freq_mhz"].get<int>() != last;
      last = in["freq_mhz"].get<int>();
    }
    if (changes > most) stage = s, most = changes;
  }
  kareus_plan* p = open(plan_json()["stages"][stage]["ranks"][1].get<int>());
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(kareus_plan_attach_controller(p, c), KAREUS_OK);
  std::vector<int> want;
  for (const auto& in : plan_json()["stages"][stage]["instructions"]) {
    const int kind = in["instruction"] == "forward" ? KAREUS_FORWARD : KAREUS_BACKWARD;
    const int mb = in["microbatch"].get<int>(), f = in["freq_mhz"].get<int>();
    if (want.empty() || want.back() != f) want.push_back(f);
    ASSERT_EQ(kareus_instruction_begin(p, kind, mb), KAREUS_OK) << kareus_last_error();
    ASSERT_EQ(kareus_instruction_end(p, kind, mb), KAREUS_OK);
  }
  // Stopping drops targets still queued, so wait until the controller has applied them all.
  ASSERT_TRUE(test::wait_until([&] {
    std::size_t n = 0;
    std::istringstream in(test::read_file(log));
    for (std::string line; std::getline(in, line);) n += line.find(R"("lock")") != line.npos;
    return n == want.size();
  }));
  ASSERT_EQ(kareus_controller_stop(c), KAREUS_OK) << kareus_last_error();
  EXPECT_EQ(kareus_controller_stop(c), KAREUS_OK) << "idempotent";
  EXPECT_EQ(kareus_controller_set_clock(c, 1200), KAREUS_ERR_STATE);
  EXPECT_EQ(kareus_instruction_begin(p, KAREUS_FORWARD, 0), KAREUS_ERR_STATE)
      << "a stopped controller is reported, not ignored";
  ASSERT_EQ(kareus_plan_attach_controller(p, nullptr), KAREUS_OK);
  kareus_controller_free(c);
  EXPECT_EQ(kareus_instruction_begin(p, KAREUS_FORWARD, 0), KAREUS_OK) << kareus_last_error();
  kareus_plan_close(p);

  std::vector<int> locks;
  std::string last_event;
  std::istringstream in(test::read_file(log));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["gpu"].get<int>(), 1);
    last_event = j["event"].get<std::string>();
    if (last_event == "lock") locks.push_back(j["freq_mhz"].get<int>());
  }
  EXPECT_EQ(locks, want);
  EXPECT_EQ(last_event, "reset");
  EXPECT_GT(want.size(), 1u) << "the plan should change clocks, or this test proves little";

  kareus_controller* bad = nullptr;
  EXPECT_EQ(kareus_controller_start(0, 1, nullptr, &bad), KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("log_path"), std::string::npos);
  EXPECT_EQ(bad, nullptr);
}

// A zombie counts as dead: the controller is our child and nobody reaped it yet.
bool dead(int pid) {
  const std::string stat = test::read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close_paren = stat.rfind(')');
  return stat.empty() || (close_paren != std::string::npos && close_paren + 2 < stat.size() &&
                          stat[close_paren + 2] == 'Z');
}

kareus_controller* start_dry_run(const std::string& log) {
  kareus_controller_options o{};
  o.dry_run = 1;
  o.log_path = log.c_str();
  o.executable = KAREUS_FREQD;
  kareus_controller* c = nullptr;
  EXPECT_EQ(kareus_controller_start_ex(&o, &c), KAREUS_OK) << kareus_last_error();
  return c;
}

TEST_F(CApi, DeadControllerIsDetachedWithOneWarningAndTrainingGoesOn) {
  test::TempDir dir;
  kareus_controller* c = start_dry_run(dir.file("freqd.jsonl"));
  ASSERT_NE(c, nullptr);
  int pid = 0;
  ASSERT_EQ(kareus_controller_pid(c, &pid), KAREUS_OK);
  kareus_plan* p = open(3);
  ASSERT_EQ(kareus_plan_attach_controller(p, c), KAREUS_OK);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(test::wait_until([&] { return dead(pid); }));
  int count = 0;
  ASSERT_EQ(kareus_plan_instruction_count(p, &count), KAREUS_OK);
  testing::internal::CaptureStderr();
  int failures = 0;
  for (int round = 0; round < 2; ++round) {  // two iterations: the warning comes only once
    for (int i = 0; i < count; ++i) {
      kareus_instruction_info info{};
      ASSERT_EQ(kareus_plan_instruction(p, i, &info), KAREUS_OK);
      failures += kareus_instruction_begin(p, info.kind, info.microbatch) != KAREUS_OK;
      failures += kareus_instruction_end(p, info.kind, info.microbatch) != KAREUS_OK;
    }
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(failures, 0) << kareus_last_error();
  std::size_t warnings = 0;
  for (auto at = err.find("warning"); at != std::string::npos; at = err.find("warning", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << err;
  EXPECT_NE(err.find("is gone"), std::string::npos) << err;
  EXPECT_NE(err.find(std::to_string(pid)), std::string::npos) << "names the controller: " << err;
  EXPECT_EQ(kareus_controller_stop(c), KAREUS_ERR_INTERNAL) << "it did not exit cleanly";
  kareus_controller_free(c);
  kareus_plan_close(p);
}

TEST_F(CApi, FreeingAnAttachedControllerDetachesItsPlans) {
  test::TempDir dir;
  const std::string log = dir.file("freqd.jsonl");
  kareus_controller* c = start_dry_run(log);
  ASSERT_NE(c, nullptr);
  kareus_plan* a = open(3);
  kareus_plan* b = open(2);
  kareus_plan* closed_first = open(1);
  ASSERT_EQ(kareus_plan_attach_controller(a, c), KAREUS_OK);
  ASSERT_EQ(kareus_plan_attach_controller(b, c), KAREUS_OK);
  ASSERT_EQ(kareus_plan_attach_controller(closed_first, c), KAREUS_OK);
  kareus_plan_close(closed_first);  // leaves no stale entry behind in the controller
  kareus_controller_free(c);
  // Without the detach these would read the freed controller; now they run without one.
  for (kareus_plan* p : {a, b}) {
    kareus_instruction_info info{};
    ASSERT_EQ(kareus_plan_instruction(p, 0, &info), KAREUS_OK);
    EXPECT_EQ(kareus_instruction_begin(p, info.kind, info.microbatch), KAREUS_OK)
        << kareus_last_error();
    EXPECT_EQ(kareus_instruction_end(p, info.kind, info.microbatch), KAREUS_OK);
  }
  // Re-attaching moves a plan between controllers.
  kareus_controller* c1 = start_dry_run(dir.file("one.jsonl"));
  kareus_controller* c2 = start_dry_run(dir.file("two.jsonl"));
  ASSERT_EQ(kareus_plan_attach_controller(a, c1), KAREUS_OK);
  ASSERT_EQ(kareus_plan_attach_controller(a, c2), KAREUS_OK);
  kareus_controller_free(c1);
  kareus_instruction_info info{};
  ASSERT_EQ(kareus_plan_instruction(a, 1, &info), KAREUS_OK);
  EXPECT_EQ(kareus_instruction_begin(a, info.kind, info.microbatch), KAREUS_OK)
      << kareus_last_error();
  kareus_controller_free(c2);
  kareus_plan_close(a);
  kareus_plan_close(b);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// A mixture-of-experts plan through the runtime's reader: its all-to-all partitions may carry
// 0 SMs (the copy engines) and the reader hands that on; 0 on a partition whose collective
// needs SMs is refused with the field named.
TEST(CApiMoe, CopyEngineSettingsReachTheRuntimeOnlyWhereAllowed) {
  test::TempDir dir;
  const std::string wl = test::source_path("tests/runtime/data/tiny_moe_ep4.yaml");
  // Nanobatching+Perseus overlaps every instruction; Kareus runs this tiny model's whole.
  const auto r = test::run_cli("plan " + wl +
                               " --max-throughput --method nanobatch_perseus --budget 16 --quiet "
                               "--out " +
                               dir.file("plan.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json plan = nlohmann::json::parse(test::read_file(dir.file("plan.json")));
  auto& parts = plan["stages"][0]["instructions"][0]["partitions"];
  ASSERT_TRUE(parts.contains("fwd_moe_experts_a2a")) << parts.dump();
  ASSERT_TRUE(parts.contains("fwd_moe_route_ar")) << parts.dump();
  parts["fwd_moe_experts_a2a"]["sms"] = 0;
  const std::string ok = dir.write("ce.json", plan.dump());
  kareus_plan* p = nullptr;
  ASSERT_EQ(kareus_plan_open(ok.c_str(), wl.c_str(), 0, &p), KAREUS_OK) << kareus_last_error();
  kareus_instruction_info info;
  ASSERT_EQ(kareus_plan_instruction(p, 0, &info), KAREUS_OK);
  bool found = false;
  for (int k = 0; k < info.partition_count; ++k) {
    kareus_partition_info pi;
    ASSERT_EQ(kareus_plan_partition(p, 0, k, &pi), KAREUS_OK);
    if (std::string(pi.key) == "fwd_moe_experts_a2a") {
      EXPECT_EQ(pi.sms, 0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  kareus_plan_close(p);
  // The router's partition overlaps an (empty) TP reduction, not an all-to-all.
  parts["fwd_moe_route_ar"]["sms"] = 0;
  const std::string bad = dir.write("bad.json", plan.dump());
  p = nullptr;
  EXPECT_EQ(kareus_plan_open(bad.c_str(), wl.c_str(), 0, &p), KAREUS_ERR_INVALID_INPUT);
  EXPECT_EQ(p, nullptr);
  const std::string err = kareus_last_error();
  EXPECT_NE(err.find("stages[0].instructions[0].partitions.fwd_moe_route_ar.sms': 0: partition "
                     "fwd_moe_route_ar allows 1..32"),
            std::string::npos)
      << err;
}

TEST_F(CApi, MonitorTimesEveryInstructionThroughTheHooks) {
  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "2000000,2300000,2400000,2450000");  // 300 J, then 50 J
  const std::string out = env.dir().file("rank2.jsonl");
  kareus_plan* p = open(2);  // stage 1
  kareus_plan* other = open(0);
  ASSERT_TRUE(p && other);
  kareus_monitor_options o{};
  o.rank = 2;
  o.stage = 1;
  o.nvml_library = env.library().c_str();
  o.out_path = out.c_str();
  o.plan = other;                // any handle of the plan
  o.tokens_per_iteration = 256;  // 2 x 32 x 4: micro-batch x sequence x micro-batches
  kareus_monitor* m = nullptr;
  kareus_monitor_options wrong = o;
  wrong.stage = 0;
  EXPECT_EQ(kareus_monitor_create(&wrong, &m), KAREUS_ERR_ARGUMENT);
  EXPECT_NE(std::string(kareus_last_error()).find("rank 2 is in stage 1"), std::string::npos)
      << kareus_last_error();
  EXPECT_EQ(m, nullptr);
  wrong = o;
  wrong.gpu_uuid = "GPU-nope";
  EXPECT_EQ(kareus_monitor_create(&wrong, &m), KAREUS_ERR_INVALID_INPUT);
  EXPECT_NE(std::string(kareus_last_error()).find("GPU-nope"), std::string::npos);
  ASSERT_EQ(kareus_monitor_create(&o, &m), KAREUS_OK) << kareus_last_error();
  int available = 0;
  ASSERT_EQ(kareus_monitor_energy_available(m, &available, nullptr), KAREUS_OK);
  EXPECT_EQ(available, 1);

  EXPECT_EQ(kareus_plan_attach_monitor(other, m), KAREUS_ERR_ARGUMENT) << "rank 0's handle";
  ASSERT_EQ(kareus_plan_attach_monitor(p, m), KAREUS_OK) << kareus_last_error();
  const auto& ins = plan_json()["stages"][1]["instructions"];
  auto kind_of = [](const nlohmann::json& in) {
    return in["instruction"] == "forward" ? KAREUS_FORWARD : KAREUS_BACKWARD;
  };
  // Outside an iteration the hook fails and changes nothing.
  EXPECT_EQ(kareus_instruction_begin_chunk(p, kind_of(ins[0]), 0, ins[0]["microbatch"].get<int>()),
            KAREUS_ERR_STATE);
  EXPECT_NE(std::string(kareus_last_error()).find("begin_iteration"), std::string::npos)
      << kareus_last_error();
  int next = -1, is_open = -1;
  ASSERT_EQ(kareus_plan_position(p, &next, &is_open), KAREUS_OK);
  EXPECT_EQ(std::pair(next, is_open), std::pair(0, 0));

  const double expected_j[] = {300, 50};
  for (int iteration = 0; iteration < 2; ++iteration) {
    ASSERT_EQ(kareus_monitor_begin_iteration(m), KAREUS_OK) << kareus_last_error();
    for (const auto& in : ins) {
      const int mb = in["microbatch"].get<int>();
      ASSERT_EQ(kareus_instruction_begin_chunk(p, kind_of(in), 0, mb), KAREUS_OK)
          << kareus_last_error();
      ASSERT_EQ(kareus_instruction_end_chunk(p, kind_of(in), 0, mb), KAREUS_OK)
          << kareus_last_error();
    }
    kareus_iteration_record r;
    ASSERT_EQ(kareus_monitor_end_iteration(m, &r), KAREUS_OK) << kareus_last_error();
    EXPECT_EQ(r.iteration, iteration);
    EXPECT_EQ(std::pair(r.rank, r.stage), std::pair(2, 1));
    EXPECT_EQ(static_cast<std::size_t>(r.instructions), ins.size());
    ASSERT_EQ(r.has_energy, 1) << r.note;
    EXPECT_DOUBLE_EQ(r.energy_j, expected_j[iteration]);
    EXPECT_DOUBLE_EQ(r.avg_power_w, expected_j[iteration] / r.time_s);
    EXPECT_LE(r.busy_time_s, r.time_s);
    EXPECT_GT(r.busy_time_s, 0);
    EXPECT_STREQ(r.note, "");
    const auto j = nlohmann::json::parse(r.json);
    EXPECT_EQ(j["record"], "iteration");
    EXPECT_DOUBLE_EQ(j["busy_time_s"].get<double>(), r.busy_time_s);
  }
  const char* text = nullptr;
  ASSERT_EQ(kareus_monitor_summary_json(m, &text), KAREUS_OK);
  const auto sum = nlohmann::json::parse(text);
  const double predicted = test::plan_gpu_energy_j(plan_json(), 1);
  EXPECT_EQ(sum["iterations"], 2);
  EXPECT_EQ(sum["instructions"].get<std::size_t>(), 2 * ins.size());
  EXPECT_DOUBLE_EQ(sum["energy_per_iteration_j"].get<double>(), 175);
  EXPECT_DOUBLE_EQ(sum["energy_per_token_j"].get<double>(), 175.0 / 256);
  EXPECT_EQ(sum["prediction"]["source"], plan_path());
  EXPECT_DOUBLE_EQ(sum["prediction"]["iteration_time_s"].get<double>(),
                   plan_json()["iteration_time_s"].get<double>());
  EXPECT_NEAR(sum["prediction"]["energy_per_iteration_j"].get<double>(), predicted,
              1e-9 * predicted);
  EXPECT_NEAR(sum["error"]["energy_per_iteration"].get<double>(), 175 / predicted - 1, 1e-9);
  int count = 0;
  ASSERT_EQ(kareus_monitor_record_count(m, &count), KAREUS_OK);
  EXPECT_EQ(count, 2);
  ASSERT_EQ(kareus_monitor_record_json(m, 1, &text), KAREUS_OK);
  EXPECT_EQ(nlohmann::json::parse(text)["iteration"], 1);
  EXPECT_EQ(kareus_monitor_record_json(m, 2, &text), KAREUS_ERR_ARGUMENT);
  EXPECT_EQ(kareus_monitor_end_iteration(m, nullptr), KAREUS_ERR_STATE);
  // An aborted iteration: resetting the hooks drops the open instruction from the monitor too.
  ASSERT_EQ(kareus_monitor_begin_iteration(m), KAREUS_OK);
  ASSERT_EQ(kareus_instruction_begin_chunk(p, kind_of(ins[0]), 0, ins[0]["microbatch"].get<int>()),
            KAREUS_OK);
  EXPECT_EQ(kareus_monitor_end_iteration(m, nullptr), KAREUS_ERR_STATE) << "an instruction is open";
  ASSERT_EQ(kareus_plan_reset_position(p), KAREUS_OK);
  kareus_iteration_record aborted;
  ASSERT_EQ(kareus_monitor_end_iteration(m, &aborted), KAREUS_OK) << kareus_last_error();
  EXPECT_EQ(aborted.instructions, 0);
  EXPECT_EQ(aborted.busy_time_s, 0);

  // Destroying the monitor writes the summary and detaches it: the hooks run without it.
  kareus_monitor_destroy(m);
  EXPECT_EQ(kareus_instruction_begin_chunk(p, kind_of(ins[0]), 0, ins[0]["microbatch"].get<int>()),
            KAREUS_OK)
      << kareus_last_error();
  kareus_plan_close(p);
  kareus_plan_close(other);
  std::vector<std::string> records;
  std::istringstream in(test::read_file(out));
  for (std::string line; std::getline(in, line);) {
    records.push_back(nlohmann::json::parse(line)["record"]);
  }
  EXPECT_EQ(records, (std::vector<std::string>{"iteration", "iteration", "iteration", "summary"}));
}

TEST_F(CApi, MonitorWithoutNvmlRecordsTimesOnly) {
  kareus_monitor_options o{};
  o.times_only = 1;
  kareus_monitor* m = nullptr;
  ASSERT_EQ(kareus_monitor_create(&o, &m), KAREUS_OK) << kareus_last_error();
  int available = 1;
  const char* reason = nullptr;
  ASSERT_EQ(kareus_monitor_energy_available(m, &available, &reason), KAREUS_OK);
  EXPECT_EQ(available, 0);
  EXPECT_NE(std::string(reason).find("nvml = false"), std::string::npos) << reason;
  ASSERT_EQ(kareus_monitor_begin_iteration(m), KAREUS_OK);
  EXPECT_EQ(kareus_monitor_begin_iteration(m), KAREUS_ERR_STATE);
  ASSERT_EQ(kareus_monitor_begin_instruction(m, KAREUS_BACKWARD, 0, 3), KAREUS_OK);
  EXPECT_EQ(kareus_monitor_end_instruction(m, KAREUS_BACKWARD, 0, 2), KAREUS_ERR_STATE);
  EXPECT_EQ(kareus_monitor_end_instruction(m, 7, 0, 3), KAREUS_ERR_ARGUMENT);
  ASSERT_EQ(kareus_monitor_end_instruction(m, KAREUS_BACKWARD, 0, 3), KAREUS_OK);
  kareus_iteration_record r;
  ASSERT_EQ(kareus_monitor_end_iteration(m, &r), KAREUS_OK);
  EXPECT_EQ(r.has_energy, 0);
  EXPECT_EQ(r.energy_j, 0);
  EXPECT_EQ(r.instructions, 1);
  EXPECT_EQ(std::string(r.note).rfind("times only: ", 0), 0u) << r.note;
  EXPECT_TRUE(nlohmann::json::parse(r.json)["energy_j"].is_null());
  ASSERT_EQ(kareus_monitor_close(m), KAREUS_OK);
  EXPECT_EQ(kareus_monitor_begin_iteration(m), KAREUS_ERR_STATE);
  int count = 0;
  ASSERT_EQ(kareus_monitor_record_count(m, &count), KAREUS_OK);
  EXPECT_EQ(count, 2) << "the iteration and the summary";
  kareus_monitor_destroy(m);
  kareus_monitor_destroy(nullptr);
  o.tokens_per_iteration = -1;
  EXPECT_EQ(kareus_monitor_create(&o, &m), KAREUS_ERR_ARGUMENT);
  EXPECT_EQ(kareus_monitor_create(nullptr, &m), KAREUS_ERR_ARGUMENT);
}

}  // namespace
}  // namespace kareus
