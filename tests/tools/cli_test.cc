#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "test_util.h"

namespace kareus {
namespace {

TEST(Cli, WorkloadShowJson) {
  const auto r = test::run_cli("workload show " +
                               test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> keys;
  for (const auto& p : j.at("partitions")) {
    keys.insert(p.at("key").get<std::string>());
    EXPECT_TRUE(p.at("collective").contains("bytes"));
    EXPECT_FALSE(p.at("launch_slots").empty());
    EXPECT_GT(p.at("repeats").get<int>(), 0);
    EXPECT_GT(p.at("compute_ops").at(0).at("bytes").get<double>(), 0);
  }
  EXPECT_EQ(keys, (std::set<std::string>{"fwd_attn", "fwd_mlp", "bwd_attn", "bwd_mlp"}));
  EXPECT_GT(j.at("model_flops_per_iteration").get<double>(), 0);
  EXPECT_GT(j.at("hardware_flops_per_iteration").get<double>(),
            j.at("model_flops_per_iteration").get<double>());
  EXPECT_EQ(j.at("segments").at(0).at("name"), "embedding");
}

TEST(Cli, WorkloadShowTable) {
  const auto r =
      test::run_cli("workload show " + test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fwd_qkv_ag"), std::string::npos);
  EXPECT_NE(r.out.find("allgather cp/2"), std::string::npos);
}

TEST(Cli, HelpAndBadFlags) {
  EXPECT_EQ(test::run_cli("--help").exit_code, 0);
  EXPECT_EQ(test::run_cli("workload show --help").exit_code, 0);
  EXPECT_EQ(test::run_cli("").exit_code, 2);
  EXPECT_EQ(test::run_cli("frobnicate").exit_code, 2);
  EXPECT_EQ(test::run_cli("workload show x.yaml --bogus").exit_code, 2);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

TEST(Cli, ProfileJsonAndInvalidValues) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto ok = test::run_cli("profile " + wl +
                                " --partition fwd_attn --freq 1410 --sms 24 --slot norm --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  for (const char* k : {"time_s", "energy_j", "dynamic_energy_j", "static_energy_j"}) {
    EXPECT_GT(j.at(k).get<double>(), 0) << k;
  }
  struct Bad {
    std::string args, needle;
  };
  for (const auto& b : std::vector<Bad>{
           {"--partition fwd_attn --freq 1400 --sms 24 --slot norm", "210..1410"},
           {"--partition fwd_attn --freq 1410 --sms 0 --slot norm", "1..32"},
           {"--partition fwd_attn --freq 1410 --sms 40 --slot norm", "1..32"},
           {"--partition fwd_attn --freq 1410 --sms 24 --slot fc1", "norm, qkv, rope, attn"},
           {"--partition ffn --freq 1410 --sms 24 --slot norm", "fwd_attn"},
           {"--partition fwd_attn --freq 1410 --sms 24 --slot norm --backend gpu", "emulator"}}) {
    const auto r = test::run_cli("profile " + wl + " " + b.args);
    EXPECT_EQ(r.exit_code, 2) << b.args;
    EXPECT_NE(r.err.find(b.needle), std::string::npos) << b.args << ": " << r.err;
  }
}

TEST(Cli, EmulateJson) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto r = test::run_cli("emulate " + wl + " --schedule nanobatch --freq 1410 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  double per_gpu = 0;
  for (const auto& s : j.at("stages")) per_gpu += s.at("energy_j_per_gpu").get<double>();
  // Whole job: 8 GPUs per stage.
  EXPECT_NEAR(j.at("energy_j").get<double>(), 8 * per_gpu, 1e-6 * per_gpu);
  EXPECT_GT(j.at("iteration_time_s").get<double>(), 0);
  EXPECT_EQ(test::run_cli("emulate " + wl + " --schedule fast").exit_code, 2);
  EXPECT_EQ(test::run_cli("emulate " + wl + " --freq 1411").exit_code, 2);
}

}  // namespace
}  // namespace kareus
