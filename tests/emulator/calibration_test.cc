// The calibration targets of issue 3 and the artifact's frontier ends of issue 28, read from the
// shared CSVs (not copied numbers).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "kareus/calibrate.h"
#include "kareus/error.h"
#include "test_util.h"

namespace kareus {
namespace {

const std::string kCsv = std::string(KAREUS_DATA_DIR) +
                         "/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv";

// The artifact's Perseus and Nanobatching+Perseus frontiers on the ten paper workloads.
std::vector<ArtifactCase> artifact() {
  return artifact_cases(
      read_artifact_csv(std::string(KAREUS_DATA_DIR) + "/calibration/artifact_frontiers.csv"),
      [](const std::string& name) { return load_workload(test::paper_workload(name)); });
}

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

// The fit of the committed defaults: the iteration targets, the GPT-3 stage profile (BLOOM held
// out) and the artifact's frontier ends on its five fit workloads (the other five held out). The
// fit lands on the committed defaults (the A100 catalogue curve, the emulator defaults and the
// profiled GPUs' limit) from the prior guesses. About 6 minutes: labelled slow.
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
  const auto fit = calibrate(w, targets, calibration_prior(), fit_profiles, held, artifact());
  EmulatorParams defaults = EmulatorModel(w.gpu()).params();  // the A100 curve resolved
  auto d = defaults.fields();
  auto f = const_cast<EmulatorParams&>(fit.params).fields();
  for (const char* name : {"cp_step_s", "partition_sync_s", "attn_kv_half", "launch_overhead_s"}) {
    EXPECT_NE(std::find(fit.fitted.begin(), fit.fitted.end(), name), fit.fitted.end()) << name;
  }
  for (const auto& name : fit.fitted) {
    // Relative: several terms are microseconds. The defaults are printed to 6 digits.
    EXPECT_NEAR(*f.at(name), *d.at(name), 1e-4 * std::abs(*d.at(name))) << name;
  }
  EXPECT_NEAR(fit.stage_power_limit_w, kPerseusStagePowerLimitW, 0.5);
  EXPECT_LT(fit.rms_error, 0.07);  // committed fit: 6.1%; each target within 10%
  ASSERT_EQ(fit.fit_part.size(), 1u);
  ASSERT_EQ(fit.held_out.size(), 1u);
  EXPECT_EQ(fit.held_out[0].model, "bloom-176b");
  EXPECT_LE(fit.held_out[0].norm_time_rms, 0.05);
  EXPECT_LE(fit.held_out[0].power_rms, 0.08);
  for (const auto& r : fit.residuals) {
    EXPECT_LT(std::abs(r.time_error), 0.10) << r.target.label;
    EXPECT_LT(std::abs(r.energy_error), 0.10) << r.target.label;
  }
}

// Issue 28's acceptance on the committed defaults, by the frontier ends without a search
// (`kareus calibrate --artifact-csv` plans them; docs/emulator.md has both): every held-out
// figure within 15%, and the sign of Nanobatching+Perseus's fastest time against Perseus's as
// measured on all ten workloads, fit and held out (among them Qwen3 1.7B CP2 TP4, where overlap
// loses 13.0% at micro-batch 8 and gains 4.4% at 16 and 1.9% at 8192 tokens).
TEST(Calibration, ArtifactHeldOutWithinFifteenPercentAndSignsOfNanobatching) {
  const auto cases = artifact();
  ASSERT_EQ(cases.size(), 20u);
  const auto rs = evaluate_artifact(cases, EmulatorParams{});
  std::map<std::string, std::map<std::string, const ArtifactResidual*>> by;
  int held = 0;
  for (const auto& r : rs) {
    by[r.workload][r.method] = &r;
    if (r.fit) continue;
    ++held;
    EXPECT_LT(std::abs(r.time_error), 0.15) << r.workload << " " << r.method;
    EXPECT_LT(std::abs(r.energy_at_fastest_error), 0.15) << r.workload << " " << r.method;
    EXPECT_LT(std::abs(r.least_energy_error), 0.15) << r.workload << " " << r.method;
  }
  EXPECT_EQ(held, 10);
  ASSERT_EQ(by.size(), 10u);
  int matches = 0;
  for (const auto& [name, m] : by) {
    const auto* p = m.at("perseus");
    const auto* n = m.at("nanobatch_perseus");
    const bool match = (n->measured.fastest_time_s > p->measured.fastest_time_s) ==
                       (n->emulated.fastest_time_s > p->emulated.fastest_time_s);
    matches += match;
    if (p->fit) {
      EXPECT_TRUE(match) << name << ": measured " << n->measured.fastest_time_s << " vs "
                         << p->measured.fastest_time_s << ", emulated "
                         << n->emulated.fastest_time_s << " vs " << p->emulated.fastest_time_s;
    }
  }
  EXPECT_EQ(matches, 10);
}

// The frontier ends against the reference schedules computed another way (emulate_schedule at
// the top clock), and the least energy at most the energy at the fastest point.
TEST(Calibration, FrontierEndsAreTheReferenceSchedulesAtTheTopClock) {
  const auto w = load_workload(test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096"));
  const EmulatorModel m(w.gpu());
  Workload seq = w;
  seq.batch.nano_batches = 1;
  const auto p = emulate_frontier_ends(w, m, "perseus");
  const auto mega = emulate_schedule(seq, m, "megatron", 1410);
  EXPECT_DOUBLE_EQ(p.fastest_time_s, mega.iteration_time_s);
  EXPECT_DOUBLE_EQ(p.energy_at_fastest_j, mega.energy_j_per_gpu_sum_over_stages());
  const auto n = emulate_frontier_ends(w, m, "nanobatch_perseus");
  const auto nano = emulate_schedule(w, m, "nanobatch", 1410);
  EXPECT_DOUBLE_EQ(n.fastest_time_s, nano.iteration_time_s);
  for (const auto& e : {p, n}) {
    EXPECT_LE(e.least_energy_j, e.energy_at_fastest_j);
    EXPECT_GT(e.least_energy_j, 0.5 * e.energy_at_fastest_j);
  }
  EXPECT_THROW(emulate_frontier_ends(w, m, "kareus"), InvalidInput);
}

}  // namespace
}  // namespace kareus
