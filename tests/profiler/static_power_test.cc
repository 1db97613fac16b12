// `kareus profile --static-power`: the backend's measured static power of the workload's GPUs;
// the emulator and the trace answer with the catalogue value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kareus/profiler.h"
#include "test_util.h"

namespace kareus {
namespace {

TEST(ProfileStaticPower, EmulatorReturnsTheCatalogueValue) {
  for (const auto& [file, gpu, watts] : std::vector<std::tuple<std::string, std::string, double>>{
           {"llama3.2-3b_tp8_mbs8_seq4096", "a100-sxm4-40gb", 85.0}}) {
    const auto r =
        test::run_cli("profile " + test::paper_workload(file) + " --static-power --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("gpu"), gpu);
    EXPECT_EQ(j.at("backend"), "emulator");
    EXPECT_DOUBLE_EQ(j.at("static_power_w").get<double>(), watts);
    EXPECT_DOUBLE_EQ(j.at("catalogue_static_power_w").get<double>(), watts);
    const auto t = test::run_cli("profile " + test::paper_workload(file) + " --static-power");
    ASSERT_EQ(t.exit_code, 0) << t.err;
    EXPECT_NE(t.out.find("85.0 W"), std::string::npos) << t.out;
  }
  ProfilerOptions o;
  o.gpu = "h100-sxm";
  EXPECT_DOUBLE_EQ(create_profiler("emulator", o)->measure_static_power_w(), 110.0);
  // One mode at a time.
  const auto both =
      test::run_cli("profile " + test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096") +
                    " --static-power --sweep");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("choose one"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace kareus
