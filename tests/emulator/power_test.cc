// The per-GPU power model (issue 12): the power cap binds where real cards are at their limit,
// in time and energy alike, the clock-power curve meets the Perseus A100 stage profiles on the
// model it was not fitted to, and H100/H200 GEMM power sits in the measured range.
#include <gtest/gtest.h>

#include <cmath>

#include "kareus/calibrate.h"
#include "kareus/emulator.h"
#include "kareus/error.h"
#include "test_util.h"

namespace kareus {
namespace {

// Board power (static included) of a kernel run.
double board_power_w(const EmulatorModel& m, const SimResult& r) {
  return r.dynamic_energy_j / r.time_s + m.gpu().static_power_w;
}

TEST(PowerModel, CapBindsOnA100GemmInTimeAndEnergy) {
  const auto& gpu = gpu_by_name("a100-sxm4-40gb");
  const EmulatorModel capped(gpu);
  EmulatorParams free_params;
  free_params.power_limit_w = 10000;  // no cap
  const EmulatorModel uncapped(gpu, free_params);
  const Kernel g = test::big_gemm();
  const SimResult c = capped.simulate_sequence({g}, 1410, 24);
  const SimResult u = uncapped.simulate_sequence({g}, 1410, 24);
  // Uncapped the GEMM would draw more than the 400 W limit, so the capped run is slower and
  // sits at or just below the limit.
  ASSERT_GT(board_power_w(uncapped, u), gpu.power_limit_w);
  EXPECT_GT(c.time_s, u.time_s);
  EXPECT_LE(board_power_w(capped, c), gpu.power_limit_w + 1e-9);
  // The firmware holds the average at the limit by alternating clock steps: the capped run sits
  // at the limit and is the uncapped model at an effective clock between the highest supported
  // clock that fits and the next step up; time and energy both come from that clock.
  EXPECT_NEAR(board_power_w(capped, c), gpu.power_limit_w, 1e-3 * gpu.power_limit_w);
  int fits = 0;
  for (int f = 1410; f >= gpu.min_freq_mhz; f -= gpu.freq_step_mhz) {
    if (board_power_w(uncapped, uncapped.simulate_sequence({g}, f, 24)) <= gpu.power_limit_w) {
      fits = f;
      break;
    }
  }
  ASSERT_GT(fits, 1100) << "the cap should cost a few clock steps, not half the clock";
  ASSERT_LT(fits, 1410);
  const SimResult below = uncapped.simulate_sequence({g}, fits, 24);
  const SimResult above = uncapped.simulate_sequence({g}, fits + gpu.freq_step_mhz, 24);
  EXPECT_LE(c.time_s, below.time_s);
  EXPECT_GT(c.time_s, above.time_s);
  EXPECT_LE(c.dynamic_energy_j / c.time_s, above.dynamic_energy_j / above.time_s);
  EXPECT_GE(c.dynamic_energy_j / c.time_s, below.dynamic_energy_j / below.time_s);
  // Well below the cap, the clock is what was asked for.
  EXPECT_NEAR(capped.simulate_sequence({g}, 1110, 24).time_s,
              uncapped.simulate_sequence({g}, 1110, 24).time_s, 1e-12);
}

TEST(PowerModel, H100GemmAtMaxClockDrawsTheMeasuredRange) {
  // Our H200 measurement (same GH100 die, 700 W limit, data/device/): GEMM-heavy partitions at
  // 694-700 W under sw_power_cap. The emulated board power of a GEMM at 1980 MHz must be in
  // 600-700 W and the cap must bind (the clock falls, as measured: 1215-1770 MHz).
  for (const char* name : {"h100-sxm", "h200"}) {
    const EmulatorModel m(gpu_by_name(name));
    EmulatorParams free_params;
    free_params.power_limit_w = 10000;
    const EmulatorModel uncapped(gpu_by_name(name), free_params);
    const SimResult r = m.simulate_sequence({test::big_gemm()}, 1980, 32);
    EXPECT_GE(board_power_w(m, r), 600) << name;
    EXPECT_LE(board_power_w(m, r), 700 + 1e-9) << name;
    EXPECT_GT(r.time_s, uncapped.simulate_sequence({test::big_gemm()}, 1980, 32).time_s) << name;
  }
}

// What `kareus profile workloads/examples/llama3.3-70b_h100_tp8_pp8_mb32.yaml --partition
// fwd_mlp --freq 1980` reports (the emulator backend, noise off): an H100 SXM GEMM partition at
// its maximum clock must draw what an H100 SXM draws under dense GEMM load: up to the 700 W
// board limit (NVIDIA H100 datasheet), at least 600 W (GEMM-heavy partitions on the same GH100
// die at 694-700 W, data/device/h200_*; DGEMM on H100 held at the power cap up to 700 W,
// arXiv 2604.11391). Before issue 12 the emulator reported about 368 W here.
TEST(PowerModel, H100GemmPartitionProfilesInThePublishedRange) {
  const auto w =
      load_workload(test::source_path("workloads/examples/llama3.3-70b_h100_tp8_pp8_mb32.yaml"));
  ASSERT_EQ(w.gpu().name, "h100-sxm");
  const auto ps = partition_workload(w);
  const Partition& part = ps.partition("fwd_mlp");
  ProfilerOptions o;
  o.gpu = w.gpu().name;
  o.noise = 0;
  EmulatorProfiler prof(o);
  PartitionConfig c;
  c.freq_mhz = w.gpu().max_freq_mhz;
  c.sms = prof.model().default_collective_sms(part.collective);
  c.slot = part.slots.front().name;
  const Measurement m = prof.measure(part, c);
  const double power_w = m.energy_j / m.time_s;
  EXPECT_GE(power_w, 600);
  EXPECT_LE(power_w, 700 + 1e-6);
  // The static part is the catalogue's, the rest is the model's dynamic energy.
  EXPECT_NEAR(m.static_energy_j, w.gpu().static_power_w * m.time_s, 1e-9);
}

// The uncalibrated curves are derived from the A100 fit (src/hw/catalogue.cc): the A40's SM power
// scaled by its budget above static power, every GPU's voltage ratio the A100's, the knee at the
// A100's fraction of the maximum clock. Written as rounded numbers there, so a refit that moves
// the A100 curve must move them too.
TEST(PowerModel, DerivedCurvesFollowTheA100Fit) {
  const auto& a100 = gpu_by_name("a100-sxm4-40gb");
  const auto& a40 = gpu_by_name("a40");
  EXPECT_NEAR(a40.sm_power_w,
              a100.sm_power_w * (a40.power_limit_w - a40.static_power_w) /
                  (a100.power_limit_w - a100.static_power_w),
              0.05);
  for (const char* name : {"a100-sxm4-80gb", "a40", "h100-sxm", "h200"}) {
    const auto& g = gpu_by_name(name);
    EXPECT_DOUBLE_EQ(g.voltage_ratio, a100.voltage_ratio) << name;
    EXPECT_NEAR(g.voltage_knee_mhz, a100.voltage_knee_mhz / a100.max_freq_mhz * g.max_freq_mhz, 0.5)
        << name;
  }
}

TEST(PowerModel, EveryGpuHasACurveAndALabel) {
  for (const auto& name : gpu_names()) {
    const auto& g = gpu_by_name(name);
    EXPECT_GT(g.sm_power_w, 0) << name;
    EXPECT_GE(g.voltage_ratio, 1.0) << name;
    EXPECT_GT(g.voltage_knee_mhz, g.min_freq_mhz) << name;
    EXPECT_LT(g.voltage_knee_mhz, g.max_freq_mhz) << name;
    EXPECT_FALSE(g.power_source.empty()) << name;
    EXPECT_EQ(g.power_caveat().empty(), g.power_calibrated) << name;
    if (!g.power_calibrated) {
      EXPECT_NE(g.power_caveat().find(g.power_source), std::string::npos) << name;
    }
    // Resolved into the model unless overridden.
    const EmulatorModel m(g);
    EXPECT_DOUBLE_EQ(m.params().sm_power_w, g.sm_power_w) << name;
    EXPECT_DOUBLE_EQ(m.params().power_limit_w, g.power_limit_w) << name;
  }
  EXPECT_TRUE(gpu_by_name("a100-sxm4-40gb").power_calibrated);
  EXPECT_FALSE(gpu_by_name("a40").power_calibrated);
  EXPECT_FALSE(gpu_by_name("h100-sxm").power_calibrated);
}

const std::string kProfileDir = std::string(KAREUS_DATA_DIR) + "/calibration/";

std::vector<StageProfilePoint> profile(const std::string& model) {
  return read_stage_profile(kProfileDir + "perseus_stage-profile_" + model + "_a100-sxm_bf16.csv");
}

// The acceptance of issue 12 on the committed parameters: BLOOM is held out of the fit.
TEST(StageProfiles, HeldOutBloomWithinAcceptance) {
  const auto rows = profile("bloom-176b");
  ASSERT_EQ(rows.size(), 8u * 2 * 38);  // 8 stages, fwd+bwd, 1410..855 MHz in 15 MHz steps
  const auto r =
      evaluate_stage_profile("bloom-176b", rows, EmulatorParams{}, kPerseusStagePowerLimitW);
  EXPECT_LE(r.norm_time_rms, 0.05);
  EXPECT_LE(r.power_rms, 0.08);
  // Independent check of the bookkeeping on one row: normalized time by hand.
  const auto& x = r.rows[2];  // stage 0 forward at 1395 MHz
  ASSERT_EQ(x.measured.freq_mhz, 1395);
  EXPECT_NEAR(x.measured_norm_time, rows[2].time_s / rows[0].time_s, 1e-12);
  EXPECT_NEAR(x.measured_power_w, rows[2].energy_j / rows[2].time_s, 1e-9);
}

TEST(StageProfiles, FitPartGpt3WithinAcceptance) {
  const auto r = evaluate_stage_profile("gpt3-175b", profile("gpt3-175b"), EmulatorParams{},
                                        kPerseusStagePowerLimitW);
  EXPECT_LE(r.norm_time_rms, 0.05);
  EXPECT_LE(r.power_rms, 0.08);
}

TEST(StageProfiles, PowerFallsWithClockAsMeasured) {
  // Measured: about 475 W at the top, about 290 W near 1095 MHz, about 235 W at 855 MHz.
  const auto r = evaluate_stage_profile("gpt3-175b", profile("gpt3-175b"), EmulatorParams{},
                                        kPerseusStagePowerLimitW);
  for (const auto& x : r.rows) {
    if (x.measured.freq_mhz == 855 || x.measured.freq_mhz == 1410) {
      EXPECT_NEAR(x.emulated_power_w, x.measured_power_w, 0.1 * x.measured_power_w)
          << x.measured.stage << " " << to_string(x.measured.kind) << " " << x.measured.freq_mhz;
    }
  }
}

TEST(StageProfiles, BadRowsNameTheFileAndLine) {
  const test::TempDir dir;
  const std::string path = dir.write(
      "bad_profile.csv", "stage,instruction,frequency,time,energy\n0,sideways,1410,0.1,40\n");
  try {
    read_stage_profile(path);
    FAIL() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("forward or backward"), std::string::npos) << e.what();
  }
}

TEST(OverlapInterference, MeanSlowdownMatchesThePublishedFigure) {
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  EmulatorParams p;
  const double s = mean_overlap_compute_slowdown(w, p);
  EXPECT_NEAR(s, kPublishedOverlapSlowdown, 0.005);
  // Not pinned at a bound: the fitted value is inside (0, 0.6) and refitting reproduces it.
  EXPECT_GT(p.overlap_slowdown, 0.0);
  EXPECT_LT(p.overlap_slowdown, 0.6);
  EXPECT_NEAR(fit_overlap_slowdown(w, p, kPublishedOverlapSlowdown), p.overlap_slowdown, 0.005);
}

}  // namespace
}  // namespace kareus
