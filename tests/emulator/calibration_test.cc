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
  const auto targets = read_calibration_targets(kCsv, 1410, 1020);
  ASSERT_EQ(targets.size(), 3u);
  EXPECT_EQ(targets[0].schedule, "megatron");
  EXPECT_EQ(targets[1].schedule, "nanobatch");
  EXPECT_EQ(targets[2].freq_mhz, 1020);
  for (const auto& r : evaluate_targets(w, EmulatorParams{}, targets)) {
    EXPECT_LT(std::abs(r.time_error), 0.10) << r.target.label << " time " << r.time_s;
    EXPECT_LT(std::abs(r.energy_error), 0.10) << r.target.label << " energy " << r.energy_j;
  }
}

TEST(Calibration, FitReproducesCommittedDefaults) {
  ASSERT_TRUE(std::filesystem::exists(kCsv)) << kCsv;
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto targets = read_calibration_targets(kCsv, 1410, 1020);
  const auto fit = calibrate(w, targets, calibration_prior());
  EmulatorParams defaults;
  auto d = defaults.fields();
  auto f = const_cast<EmulatorParams&>(fit.params).fields();
  for (const auto& name : fit.fitted) {
    EXPECT_NEAR(*f.at(name), *d.at(name), 1e-3 * std::max(1.0, std::abs(*d.at(name)))) << name;
  }
  EXPECT_LT(fit.rms_error, 0.05);
}

}  // namespace
}  // namespace kareus
