// The fuzzers' committed inputs (tests/fuzz/<target>/: seeds and inputs that once crashed) run
// through the same target bodies in every test build, so a fixed finding stays fixed without
// clang or libFuzzer, and the debug preset replays them under ASan/UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "fuzz/targets.h"
#include "kareus/plan.h"
#include "kareus/plan_check.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus {
namespace {

using Target = int (*)(const std::uint8_t*, std::size_t);

// Runs every file of tests/fuzz/<dir>; returns how many ran.
int replay(const std::string& dir, Target target) {
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(test::source_path("tests/fuzz/" + dir))) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(e.path().string());
    EXPECT_EQ(target(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()), 0);
    ++n;
  }
  return n;
}

TEST(FuzzCorpus, WorkloadInputsRunClean) {
  EXPECT_GE(replay("workload", fuzz::workload_one_input), 3);
}
TEST(FuzzCorpus, PlanInputsRunClean) { EXPECT_GE(replay("plan", fuzz::plan_one_input), 1); }
TEST(FuzzCorpus, TraceInputsRunClean) { EXPECT_GE(replay("trace", fuzz::trace_one_input), 2); }

// The plan seeds must reach validate_plan's checks: they were made for the target's workload,
// so they validate; a seed of another workload would stop at the digest and fuzz nothing else.
TEST(FuzzCorpus, PlanSeedsValidateAgainstTheTargetWorkload) {
  const Workload w = parse_workload(fuzz::kPlanWorkloadYaml, "tiny.yaml");
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path("tests/fuzz/plan"))) {
    if (e.path().filename().string().rfind("seed-", 0) != 0) continue;
    EXPECT_NO_THROW(load_plan(e.path().string(), w)) << e.path();
    ++n;
  }
  EXPECT_GE(n, 1);
}

}  // namespace
}  // namespace kareus
