// `kareus monitor merge` on hand-written rank files: the job's per-iteration figures (time: max
// over the ranks, energy: sum, W/GPU) and totals computed here by hand, the comparison with a
// plan's prediction, and bad input (exit 2 naming the file, the line and the field).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "test_util.h"

namespace kareus {
namespace {

/// One iteration record as the monitor writes it (docs/formats.md).
std::string iteration_line(int rank, int stage, int iteration, double time_s,
                           std::optional<double> energy_j, double busy_s, const std::string& uuid,
                           const std::string& note = "") {
  nlohmann::json j = {{"record", "iteration"},
                      {"rank", rank},
                      {"stage", stage},
                      {"iteration", iteration},
                      {"start_unix_s", 1.7e9 + iteration},
                      {"time_s", time_s},
                      {"energy_j", energy_j ? nlohmann::json(*energy_j) : nullptr},
                      {"avg_power_w", energy_j ? nlohmann::json(*energy_j / time_s) : nullptr},
                      {"busy_time_s", busy_s},
                      {"instructions", 8},
                      {"gpu_uuid", energy_j ? nlohmann::json(uuid) : nullptr}};
  if (!note.empty()) j["note"] = note;
  return j.dump() + "\n";
}

/// Two ranks of a 2-stage job, three iterations; rank 0 has no energy for iteration 2.
struct TwoRanks {
  test::TempDir dir;
  std::string a, b;
  TwoRanks() {
    a = dir.write("rank0.jsonl", iteration_line(0, 0, 0, 1.0, 300, 0.8, "GPU-a") +
                                     iteration_line(0, 0, 1, 1.2, 330, 0.9, "GPU-a") +
                                     iteration_line(0, 0, 2, 1.1, std::nullopt, 0.85, "GPU-a",
                                                    "NVML's energy counter went down"));
    b = dir.write(
        "rank1.jsonl",
        iteration_line(1, 1, 0, 1.1, 200, 0.7, "GPU-b") +
            R"({"record": "instruction", "rank": 1, "stage": 1, "iteration": 1, "kind": "backward", "microbatch": 0, "chunk": 0, "start_unix_s": 1.7e9, "time_s": 0.1, "energy_j": 20, "avg_power_w": 200})"
            "\n" +
            iteration_line(1, 1, 1, 1.0, 250, 0.95, "GPU-b") +
            iteration_line(1, 1, 2, 1.3, 260, 0.9, "GPU-b") +
            R"({"record": "summary", "rank": 1, "stage": 1, "gpu_uuid": "GPU-b", "iterations": 3})"
            "\n");
  }
};

nlohmann::json merge_json(const std::string& args) {
  const auto r = test::run_cli("monitor merge " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(MonitorMerge, JobFiguresAreTheMaxTimeAndTheSummedEnergy) {
  const TwoRanks t;
  const auto j = merge_json(t.b + " " + t.a);  // any order: sorted by rank
  EXPECT_EQ(j["ranks"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["stages"], 2);
  ASSERT_EQ(j["iterations"].size(), 3u);
  const auto& it = j["iterations"];
  EXPECT_DOUBLE_EQ(it[0]["time_s"].get<double>(), 1.1);
  EXPECT_DOUBLE_EQ(it[0]["energy_j"].get<double>(), 500);
  EXPECT_DOUBLE_EQ(it[0]["avg_power_per_gpu_w"].get<double>(), 500 / (1.1 * 2));
  EXPECT_DOUBLE_EQ(it[1]["time_s"].get<double>(), 1.2);
  EXPECT_DOUBLE_EQ(it[1]["energy_j"].get<double>(), 580);
  EXPECT_DOUBLE_EQ(it[1]["avg_power_per_gpu_w"].get<double>(), 580 / (1.2 * 2));
  EXPECT_DOUBLE_EQ(it[2]["time_s"].get<double>(), 1.3);
  EXPECT_TRUE(it[2]["energy_j"].is_null()) << "rank 0 has none";
  EXPECT_TRUE(it[2]["avg_power_per_gpu_w"].is_null());
  EXPECT_EQ(it[1]["stage_busy_time_s"], nlohmann::json({0.9, 0.95}));
  const auto& total = j["total"];
  EXPECT_EQ(total["iterations"], 3);
  EXPECT_EQ(total["energy_iterations"], 2);
  EXPECT_DOUBLE_EQ(total["time_s"].get<double>(), 1.1 + 1.2 + 1.3);
  EXPECT_DOUBLE_EQ(total["time_per_iteration_s"].get<double>(), 3.6 / 3);
  EXPECT_DOUBLE_EQ(total["energy_j"].get<double>(), 1080);
  EXPECT_DOUBLE_EQ(total["energy_per_iteration_j"].get<double>(), 540);
  EXPECT_DOUBLE_EQ(total["avg_power_per_gpu_w"].get<double>(), 1080 / ((1.1 + 1.2) * 2));
  EXPECT_FALSE(j.contains("prediction"));
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_NE(j["notes"][0].get<std::string>().find("1 of 3 iterations lack"), std::string::npos);
  EXPECT_EQ(j["files"][1]["gpu_uuid"], "GPU-b");

  const auto text = test::run_cli("monitor merge " + t.a + " " + t.b);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* part : {"2 ranks, 2 stages, 3 iterations", "500.0", "227.3", "580.0",
                           "per iteration: 1.2000 s, 540.0 J, 234.8 W/GPU", "note: 1 of 3"}) {
    EXPECT_NE(text.out.find(part), std::string::npos) << part << "\n" << text.out;
  }
}

TEST(MonitorMerge, IterationsMissingFromARankAreLeftOutAndNamed) {
  test::TempDir dir;
  const std::string a = dir.write("a.jsonl", iteration_line(0, 0, 0, 1, 10, 1, "GPU-a") +
                                                 iteration_line(0, 0, 1, 1, 10, 1, "GPU-a") +
                                                 iteration_line(0, 0, 2, 1, 10, 1, "GPU-a"));
  const std::string b = dir.write("b.jsonl", iteration_line(1, 0, 0, 2, 5, 1, "GPU-b"));
  const auto j = merge_json(a + " " + b);
  ASSERT_EQ(j["iterations"].size(), 1u);
  EXPECT_DOUBLE_EQ(j["total"]["energy_j"].get<double>(), 15);
  EXPECT_EQ(j["stages"], 1);
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_NE(j["notes"][0].get<std::string>().find("rank 1 (" + b + ") lacks iterations 1-2"),
            std::string::npos)
      << j["notes"];
}

/// A plan of the tiny TP=2, PP=2 job (4 GPUs, 256 tokens per iteration), made once.
class MonitorMergePlan : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const auto r = test::run_cli("plan " + workload() + " --min-energy --quiet --out " +
                                 dir_->file("plan.json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    plan_ = new nlohmann::json(nlohmann::json::parse(test::read_file(dir_->file("plan.json"))));
  }
  static void TearDownTestSuite() {
    delete plan_;
    delete dir_;
  }
  static std::string workload() {
    return test::source_path("tests/runtime/data/tiny_tp2_pp2.yaml");
  }
  static std::string plan_path() { return dir_->file("plan.json"); }
  /// Rank r's file: iteration i takes 0.5 + 0.1 i + 0.01 r s and 10 (r + 1) + i J.
  static std::string rank_file(int rank, int stage) {
    std::string text;
    for (int i = 0; i < 2; ++i) {
      text += iteration_line(rank, stage, i, 0.5 + 0.1 * i + 0.01 * rank, 10.0 * (rank + 1) + i,
                             0.4, fmt::format("GPU-{}", rank));
    }
    return dir_->write(fmt::format("rank{}.jsonl", rank), text);
  }
  static test::TempDir* dir_;
  static nlohmann::json* plan_;
};
test::TempDir* MonitorMergePlan::dir_ = nullptr;
nlohmann::json* MonitorMergePlan::plan_ = nullptr;

TEST_F(MonitorMergePlan, EveryRankComparedWithThePlansPrediction) {
  std::string files;
  for (int r = 0; r < 4; ++r) files += rank_file(r, r / 2) + " ";
  const auto j = merge_json(files + "--plan " + plan_path() + " --workload " + workload());
  const double t = (*plan_)["iteration_time_s"], e = (*plan_)["energy_j"];
  // Every GPU of the job: the prediction is the plan's whole-job energy.
  EXPECT_NEAR(j["prediction"]["energy_per_iteration_j"].get<double>(), e, 1e-9 * e);
  EXPECT_DOUBLE_EQ(j["prediction"]["iteration_time_s"].get<double>(), t);
  EXPECT_NEAR(j["prediction"]["avg_power_per_gpu_w"].get<double>(), e / (t * 4), 1e-9 * e);
  EXPECT_NEAR(j["prediction"]["energy_per_token_j"].get<double>(), e / 256, 1e-12 * e);
  EXPECT_EQ(j["prediction"]["gpus"], 4);
  // Measured: iteration 0 sums 10 + 20 + 30 + 40 = 100 J in max(0.5 .. 0.53) s, iteration 1 104 J
  // in 0.63 s.
  EXPECT_DOUBLE_EQ(j["total"]["energy_per_iteration_j"].get<double>(), 102);
  EXPECT_NEAR(j["total"]["time_per_iteration_s"].get<double>(), (0.53 + 0.63) / 2, 1e-12);
  EXPECT_NEAR(j["total"]["avg_power_per_gpu_w"].get<double>(), 204 / ((0.53 + 0.63) * 4), 1e-9);
  EXPECT_DOUBLE_EQ(j["total"]["tokens_per_iteration"].get<double>(), 256);
  EXPECT_DOUBLE_EQ(j["total"]["energy_per_token_j"].get<double>(), 102.0 / 256);
  EXPECT_NEAR(j["error"]["energy_per_iteration"].get<double>(), 102 / e - 1, 1e-9);
  EXPECT_NEAR(j["error"]["iteration_time"].get<double>(), 0.58 / t - 1, 1e-9);
  EXPECT_NEAR(j["error"]["avg_power_per_gpu"].get<double>(),
              (204 / ((0.53 + 0.63) * 4)) / (e / (t * 4)) - 1, 1e-9);
  EXPECT_NEAR(j["error"]["energy_per_token"].get<double>(), 102 / e - 1, 1e-9);
  EXPECT_TRUE(j["notes"].empty()) << j["notes"];

  const auto text = test::run_cli("monitor merge " + files + "--plan " + plan_path() +
                                  " --workload " + workload());
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* part : {"4 ranks of the job's 4, 2 stages, 2 iterations", "predicted by",
                           "measured vs predicted: time ", "J/token"}) {
    EXPECT_NE(text.out.find(part), std::string::npos) << part << "\n" << text.out;
  }
}

TEST_F(MonitorMergePlan, SomeRanksAreComparedWithTheirOwnGpusPrediction) {
  const auto j = merge_json(rank_file(2, 1) + " " + rank_file(3, 1) + " --plan " + plan_path() +
                            " --workload " + workload());
  // Rank 2 and 3 (stage 1): two GPUs of stage 1, by the plan's per-GPU rule (docs/formats.md).
  const double per_gpu = test::plan_gpu_energy_j(*plan_, 1);
  EXPECT_NEAR(j["prediction"]["energy_per_iteration_j"].get<double>(), 2 * per_gpu, 1e-9 * per_gpu);
  EXPECT_TRUE(j["prediction"]["energy_per_token_j"].is_null());
  EXPECT_TRUE(j["total"]["energy_per_token_j"].is_null());
  EXPECT_TRUE(j["error"]["energy_per_token"].is_null());
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_NE(j["notes"][0].get<std::string>().find("J/token needs every rank's file: 2 of the "
                                                  "job's 4 given"),
            std::string::npos);
}

TEST_F(MonitorMergePlan, ARankInAnotherStageThanThePlansIsRefused) {
  const std::string f = rank_file(2, 0);  // the plan puts rank 2 in stage 1
  const auto r =
      test::run_cli("monitor merge " + f + " --plan " + plan_path() + " --workload " + workload());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(f + ":1: field 'stage': 0: the plan"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("puts rank 2 in stage 1"), std::string::npos) << r.err;
  const auto alone = test::run_cli("monitor merge " + f + " --plan " + plan_path());
  EXPECT_EQ(alone.exit_code, 2) << "--plan needs --workload";
  EXPECT_NE(alone.err.find("--workload"), std::string::npos) << alone.err;
}

/// Exit 2 and every part in the message.
void expect_refused(const std::string& args, std::initializer_list<std::string> parts) {
  const auto r = test::run_cli("monitor merge " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
  for (const auto& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << p << "\n" << r.err;
}

TEST(MonitorMerge, BadInputExitsTwoNamingTheFileTheLineAndTheField) {
  const TwoRanks t;
  const std::string good = iteration_line(0, 0, 0, 1, 1, 1, "GPU-a");
  expect_refused(t.a + " /no/such/rank.jsonl", {"/no/such/rank.jsonl", "no such file"});
  const std::string broken = t.dir.write("broken.jsonl", good + "{\"record\": \"iter\n");
  expect_refused(broken, {broken + ":2:", "not a JSON line"});
  const std::string freqd = t.dir.write(
      "freqd.jsonl", R"({"t_s": 1712345678.1, "gpu": 0, "freq_mhz": 1410, "event": "lock"})"
                     "\n");
  expect_refused(freqd,
                 {freqd + ":1: field 'record': missing: not a kareus energy-monitor record"});
  auto without = [&](const char* key) {
    auto j = nlohmann::json::parse(good);
    j.erase(key);
    return j.dump() + "\n";
  };
  const std::string missing = t.dir.write("missing.jsonl", good + without("time_s"));
  expect_refused(missing, {missing + ":2: field 'time_s': missing (every iteration record"});
  auto with = [&](const char* key, const nlohmann::json& v) {
    auto j = nlohmann::json::parse(good);
    j[key] = v;
    return j.dump() + "\n";
  };
  const std::string typed = t.dir.write("typed.jsonl", with("energy_j", "lots"));
  expect_refused(typed, {typed + ":1: field 'energy_j': \"lots\": allowed a number >= 0"});
  const std::string negative = t.dir.write("negative.jsonl", with("iteration", -1));
  expect_refused(negative, {negative + ":1: field 'iteration': -1: allowed an integer >= 0"});
  const std::string kind = t.dir.write("kind.jsonl", with("record", "epoch"));
  expect_refused(kind, {kind + ":1: field 'record': 'epoch': allowed iteration, instruction, "
                               "summary"});
  const std::string twice = t.dir.write("twice.jsonl", good + good);
  expect_refused(twice, {twice + ":2: field 'iteration': 0 appears twice (lines 1 and 2)"});
  const std::string mixed = t.dir.write("mixed.jsonl", good + with("rank", 5));
  expect_refused(mixed, {mixed + ":2: field 'rank'", "one rank"});
  const std::string empty = t.dir.write("empty.jsonl", "");
  expect_refused(empty, {empty + ": no iteration records"});
  const std::string same_rank = t.dir.write("again.jsonl", iteration_line(0, 0, 0, 1, 1, 1, "X"));
  expect_refused(t.a + " " + same_rank, {"field 'rank': both hold rank 0"});
  const std::string same_gpu = t.dir.write("gpu.jsonl", iteration_line(5, 0, 0, 1, 1, 1, "GPU-a"));
  expect_refused(t.a + " " + same_gpu, {"field 'gpu_uuid': both measured GPU GPU-a"});
  const std::string plan = t.dir.write("plan.json", "{\n  \"format\": \"kareus-plan\"\n}\n");
  expect_refused(plan, {plan + ":1: not a JSON line"});
}

}  // namespace
}  // namespace kareus
