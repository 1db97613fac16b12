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
