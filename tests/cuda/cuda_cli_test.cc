// `--backend cuda` on a machine without a GPU (CI): a clear one-line refusal with exit code 2,
// never a crash or a hang. Built with CUDA the runtime finds no device; built without it the
// stub says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "test_util.h"

namespace kareus {
namespace {

TEST(CudaCli, NoDeviceExitsTwoWithOneClearLine) {
  if (std::filesystem::exists("/dev/nvidia0")) GTEST_SKIP() << "a GPU is present";
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto r = test::run_cli("profile " + wl +
                               " --partition fwd_attn --freq 1410 --sms 24 --slot norm "
                               "--backend cuda --window-s 1 --cooldown-s 1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
#ifdef KAREUS_TEST_WITH_CUDA
  EXPECT_NE(r.err.find("no CUDA device visible"), std::string::npos) << r.err;
#else
  EXPECT_NE(r.err.find("this build has no CUDA support"), std::string::npos) << r.err;
#endif
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(CudaCli, BadWindowIsRejected) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto r = test::run_cli("profile " + wl +
                               " --partition fwd_attn --freq 1410 --sms 24 --slot norm "
                               "--backend cuda --window-s 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--window-s"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kareus
