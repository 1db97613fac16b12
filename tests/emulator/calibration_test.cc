// The calibration targets of issue 3, read from the shared CSV (not copied numbers).
#include <gtest/gtest.h>

#include <filesystem>

#include "kareus/calibrate.h"
#include "test_util.h"

namespace kareus {
namespace {

const std::string kCsv = std::string(KAREUS_DATA_DIR) +
                         "/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv";

TEST(Calibration, DefaultsMeetTheThreeTargetsWithinTenPercent) {
  ASSERT_TRUE(std::filesystem::exists(kCsv)) << kCsv;
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto targets = read_calibration_targets(kCsv, 1410);
  ASSERT_EQ(targets.size(), 3u);
  EXPECT_EQ(targets[0].schedule, "megatron");
  EXPECT_EQ(targets[1].schedule, "nanobatch");
  EXPECT_EQ(targets[2].schedule, "perseus-slowest");
  for (const auto& r : evaluate_targets(w, EmulatorParams{}, targets)) {
    EXPECT_LT(std::abs(r.time_error), 0.10) << r.target.label << " time " << r.time_s;
    EXPECT_LT(std::abs(r.energy_error), 0.10) << r.target.label << " energy " << r.energy_j;
  }
}

// `kareus calibrate` as shipped: the iteration targets plus the GPT-3 stage profile, BLOOM held
// out. The fit lands on the committed defaults (the A100 catalogue curve, the emulator defaults
// and the profiled GPUs' limit) from the prior guesses.
TEST(Calibration, FitReproducesCommittedDefaults) {
  ASSERT_TRUE(std::filesystem::exists(kCsv)) << kCsv;
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto targets = read_calibration_targets(kCsv, 1410);
  const std::string dir = std::string(KAREUS_DATA_DIR) + "/calibration/";
  const StageProfiles fit_profiles = {
      {"gpt3-175b", read_stage_profile(dir + "perseus_stage-profile_gpt3-175b_a100-sxm_bf16.csv")}};
  const StageProfiles held = {
      {"bloom-176b",
       read_stage_profile(dir + "perseus_stage-profile_bloom-176b_a100-sxm_bf16.csv")}};
  const auto fit = calibrate(w, targets, calibration_prior(), fit_profiles, held);
  EmulatorParams defaults = EmulatorModel(w.gpu()).params();  // the A100 curve resolved
  auto d = defaults.fields();
  auto f = const_cast<EmulatorParams&>(fit.params).fields();
  for (const auto& name : fit.fitted) {
    EXPECT_NEAR(*f.at(name), *d.at(name), 1e-3 * std::max(1.0, std::abs(*d.at(name)))) << name;
  }
  EXPECT_NEAR(fit.stage_power_limit_w, kPerseusStagePowerLimitW, 0.5);
  EXPECT_LT(fit.rms_error, 0.06);  // committed fit: 5.7%; each target within 10%
  ASSERT_EQ(fit.fit_part.size(), 1u);
  ASSERT_EQ(fit.held_out.size(), 1u);
  EXPECT_EQ(fit.held_out[0].model, "bloom-176b");
  EXPECT_LE(fit.held_out[0].norm_time_rms, 0.05);
  EXPECT_LE(fit.held_out[0].power_rms, 0.08);
}

}  // namespace
}  // namespace kareus
