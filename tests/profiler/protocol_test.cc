#include "kareus/protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <vector>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/thermal.h"
#include "test_util.h"

namespace kareus {
namespace {

// A scripted target: every iteration takes `iteration_s` and costs `energy_per_gpu_j` on each
// GPU; clocks and throttle masks come from per-window scripts. Records every call.
class FakeTarget : public MeasurementTarget {
 public:
  double iteration_s = 0.01;
  double energy_per_gpu_j = 2.0;
  int group = 2;
  // Clock reads in order (the protocol reads the clock before and after each window) and the
  // throttle mask read after each window. Empty scripts mean 1410 MHz and no throttling.
  std::deque<int> clocks;
  std::deque<std::uint64_t> masks;
  std::vector<std::string> calls;

  double run(int iterations) override {
    calls.push_back("run " + std::to_string(iterations));
    energy_ += energy_per_gpu_j * iterations * group;
    ++runs_;
    return iterations * iteration_s;
  }
  double energy_j() override { return energy_; }
  double temperature_c() override { return 40.0 + runs_; }
  int sm_clock_mhz() override {
    if (clocks.empty()) return 1410;
    const int c = clocks.front();
    clocks.pop_front();
    return c;
  }
  std::uint64_t throttle_mask() override {
    calls.push_back("mask");
    // The read before a window clears; the read after returns the script's value.
    if (!after_window_read_) {
      after_window_read_ = true;
      return 0xffff;  // stale reasons from before the window must not count
    }
    after_window_read_ = false;
    if (masks.empty()) return 0;
    const auto m = masks.front();
    masks.pop_front();
    return m;
  }
  std::string describe_throttle(std::uint64_t mask) const override {
    return nvml::ClockEventReasons{mask}.describe();
  }
  void idle(double seconds) override { calls.push_back("idle " + std::to_string(seconds)); }
  int gpus() const override { return group; }

 private:
  double energy_ = 0;
  int runs_ = 0;
  bool after_window_read_ = false;
};

TEST(Protocol, ScriptedStableWindowIsExact) {
  FakeTarget t;
  ProtocolOptions o;  // 10 warm-up, 100 calibration, 5 s window, 5 s cool-down
  const auto r = run_protocol(t, o, 1410);
  // 100 calibration iterations take 1 s: 0.01 s each, so ceil(5 / 0.01) = 500 fill the window.
  EXPECT_TRUE(r.stable);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.iterations, 500);
  EXPECT_DOUBLE_EQ(r.window_s, 5.0);
  EXPECT_DOUBLE_EQ(r.time_s, 0.01);
  EXPECT_DOUBLE_EQ(r.energy_j, 2.0);  // 500 x 2 J x 2 GPUs / 500 / 2
  EXPECT_EQ(r.clock_mhz, 1410);
  EXPECT_EQ(r.throttle_mask, 0u);
  EXPECT_DOUBLE_EQ(r.temperature_before_c, 42.0);  // two runs (warm-up, calibration) before
  EXPECT_DOUBLE_EQ(r.temperature_after_c, 43.0);
  EXPECT_EQ(t.calls, (std::vector<std::string>{"run 10", "run 100", "mask", "run 500", "mask",
                                               "idle " + std::to_string(5.0)}));
}

TEST(Protocol, CalibrationFillsTheWindow) {
  for (const double it_s : {0.003, 0.0071, 0.37, 7.0}) {
    FakeTarget t;
    t.iteration_s = it_s;
    ProtocolOptions o;
    o.window_s = 1.0;
    o.calibration_iterations = 7;
    const auto r = run_protocol(t, o, 0);
    const int expect = static_cast<int>(std::ceil(1.0 / it_s - 1e-9));
    EXPECT_EQ(r.iterations, std::max(1, expect)) << it_s;
    EXPECT_GE(r.window_s, o.window_s) << it_s;
    // One iteration fewer would not have filled it.
    if (r.iterations > 1) {
      EXPECT_LT((r.iterations - 1) * it_s, o.window_s) << it_s;
    }
  }
  FakeTarget t;
  t.iteration_s = 0.003;
  ProtocolOptions o;
  o.window_s = 1.0;
  EXPECT_EQ(run_protocol(t, o, 0).iterations, 334);  // 333 x 3 ms = 0.999 s < 1 s
}

TEST(Protocol, ScriptedDriftAndThrottleAreRepeated) {
  FakeTarget t;
  // Window 1 drifts 31 MHz (allowed 30), window 2 throttles, window 3 drifts exactly 30: stable.
  t.clocks = {1410, 1379, 1410, 1410, 1380, 1410};
  t.masks = {0, nvml::kReasonHwPowerBrake, 0};
  ProtocolOptions o;
  o.max_attempts = 5;
  const auto r = run_protocol(t, o, 1410);
  EXPECT_TRUE(r.stable);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(r.clock_mhz, 1380);
  EXPECT_NE(r.note.find("attempt 1: clock 1379..1410 MHz drifted 31 MHz"), std::string::npos)
      << r.note;
  EXPECT_NE(r.note.find("attempt 2: throttled (hw_power_brake_slowdown)"), std::string::npos)
      << r.note;
  // Each attempt warms up, calibrates, measures and cools down.
  int idles = 0;
  for (const auto& c : t.calls) idles += c.rfind("idle", 0) == 0;
  EXPECT_EQ(idles, 3);
}

// Software power capping is the steady state of GEMM-heavy work at top clock: recorded, not
// repeated. Repeating reasons mixed with it are repeated and named without it.
TEST(Protocol, SwPowerCapIsRecordedNotRepeated) {
  FakeTarget t;
  t.masks = {nvml::kReasonSwPowerCap};
  const auto r = run_protocol(t, {}, 1410);
  EXPECT_TRUE(r.stable) << r.note;
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.throttle_mask, nvml::kReasonSwPowerCap);
  EXPECT_TRUE(r.note.empty()) << r.note;

  FakeTarget u;
  u.masks = {nvml::kReasonSwPowerCap | nvml::kReasonSwThermalSlowdown, nvml::kReasonSwPowerCap};
  const auto q = run_protocol(u, {}, 1410);
  EXPECT_TRUE(q.stable) << q.note;
  EXPECT_EQ(q.attempts, 2);
  EXPECT_EQ(q.throttle_mask, nvml::kReasonSwPowerCap);
  EXPECT_NE(q.note.find("attempt 1: throttled (sw_thermal_slowdown)"), std::string::npos) << q.note;
  EXPECT_EQ(kRepeatThrottleMask, nvml::kReasonHwSlowdown | nvml::kReasonSwThermalSlowdown |
                                     nvml::kReasonHwThermalSlowdown | nvml::kReasonHwPowerBrake);
}

// A real GPU: reads before the window is queued and after it has synchronised see an idle card
// at its requested clock with no reason raised; only samples taken while the window runs show
// the throttling. Window 1 throttles and drops to 1305 MHz mid-window, window 2 is clean.
class WindowSampledTarget : public FakeTarget {
 public:
  std::deque<WindowObservation> windows;  // one per run_window call; empty: clean at 1410
  int window_calls = 0;
  WindowObservation run_window(int iterations) override {
    ++window_calls;
    WindowObservation w;
    if (!windows.empty()) {
      w = windows.front();
      windows.pop_front();
    } else {
      w.samples = 100;
      w.first_clock_mhz = w.min_clock_mhz = w.max_clock_mhz = 1410;
    }
    w.elapsed_s = run(iterations);
    return w;
  }
};

TEST(Protocol, ThrottlingVisibleOnlyDuringTheWindowIsRepeated) {
  WindowSampledTarget t;  // the idle reads around every window: 1410 MHz, mask 0
  WindowObservation bad;
  bad.samples = 100;
  bad.first_clock_mhz = 1410;
  bad.min_clock_mhz = 1305;
  bad.max_clock_mhz = 1410;
  bad.throttle_mask = nvml::kReasonHwSlowdown;
  t.windows = {bad};
  const auto r = run_protocol(t, {}, 1410);
  EXPECT_TRUE(r.stable) << r.note;
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(t.window_calls, 2);
  EXPECT_EQ(r.clock_mhz, 1410);
  EXPECT_EQ(r.throttle_mask, 0u);
  EXPECT_NE(r.note.find("attempt 1: clock 1305..1410 MHz drifted 105 MHz from 1410 MHz"),
            std::string::npos)
      << r.note;
  EXPECT_NE(r.note.find("throttled (hw_slowdown)"), std::string::npos) << r.note;

  // The clock alone, sampled mid-window, repeats it too; with no expected clock the reference is
  // the first sample, not the idle read before the window.
  WindowSampledTarget c;
  c.clocks = {1980, 1980, 1980, 1980};  // idle reads: the card's boost clock
  WindowObservation slow;
  slow.samples = 40;
  slow.first_clock_mhz = 1755;
  slow.min_clock_mhz = 1700;
  slow.max_clock_mhz = 1755;
  WindowObservation steady = slow;
  steady.min_clock_mhz = 1740;
  c.windows = {slow, steady};
  const auto q = run_protocol(c, {}, 0);
  EXPECT_TRUE(q.stable) << q.note;
  EXPECT_EQ(q.attempts, 2);
  EXPECT_EQ(q.clock_mhz, 1740);
  EXPECT_EQ(q.clock_max_mhz, 1755);
  EXPECT_NE(q.note.find("clock 1700..1755 MHz drifted 55 MHz from 1755 MHz"), std::string::npos)
      << q.note;
}

// The H200 device check (docs/cuda.md): GEMM windows at 1980 MHz fell to 1215-1770 MHz with
// sw_power_cap raised. That is the setting's steady state: accepted at once, not repeated.
TEST(Protocol, FallUnderThePowerCapIsAcceptedAsCapped) {
  WindowSampledTarget t;
  WindowObservation capped;
  capped.samples = 20;
  capped.first_clock_mhz = 1980;
  capped.min_clock_mhz = 1215;
  capped.max_clock_mhz = 1980;
  capped.throttle_mask = nvml::kReasonSwPowerCap;
  t.windows = {capped};
  const auto r = run_protocol(t, {}, 1980);
  EXPECT_TRUE(r.stable) << r.note;
  EXPECT_TRUE(r.power_capped);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.clock_mhz, 1215);
  EXPECT_EQ(r.clock_max_mhz, 1980);
  EXPECT_EQ(r.throttle_mask, nvml::kReasonSwPowerCap);

  // The same fall without the cap is a drift: repeated, and not marked capped.
  WindowSampledTarget u;
  WindowObservation fell = capped;
  fell.throttle_mask = 0;
  WindowObservation steady = fell;
  steady.min_clock_mhz = 1980;
  u.windows = {fell, steady};
  const auto q = run_protocol(u, {}, 1980);
  EXPECT_TRUE(q.stable) << q.note;
  EXPECT_FALSE(q.power_capped);
  EXPECT_EQ(q.attempts, 2);

  // Nor is a clock above the expected one, cap or not; nor a cap with a thermal slowdown.
  for (const auto& [hi, mask] : {std::pair<int, std::uint64_t>{2040, nvml::kReasonSwPowerCap},
                                 {1980, nvml::kReasonSwPowerCap | nvml::kReasonHwSlowdown}}) {
    WindowSampledTarget v;
    WindowObservation odd = capped;
    odd.max_clock_mhz = hi;
    odd.throttle_mask = mask;
    v.windows = {odd, odd, odd};
    const auto x = run_protocol(v, {}, 1980);
    EXPECT_FALSE(x.stable) << hi << " " << mask;
    EXPECT_FALSE(x.power_capped);
    EXPECT_EQ(x.attempts, 3);
  }
}

TEST(Protocol, ScriptedAlwaysThrottledEndsUnstable) {
  FakeTarget t;
  t.masks = {nvml::kReasonHwSlowdown, nvml::kReasonHwSlowdown, nvml::kReasonHwSlowdown,
             nvml::kReasonHwSlowdown};
  ProtocolOptions o;
  o.max_attempts = 4;
  const auto r = run_protocol(t, o, 1410);
  EXPECT_FALSE(r.stable);
  EXPECT_EQ(r.attempts, 4);
  EXPECT_EQ(r.throttle_mask, nvml::kReasonHwSlowdown);
  EXPECT_NE(r.note.find("attempt 4: throttled (hw_slowdown)"), std::string::npos) << r.note;
  // The last window's numbers are still returned.
  EXPECT_DOUBLE_EQ(r.energy_j, 2.0);
}

TEST(Protocol, NoExpectedClockAcceptsAnySteadyClock) {
  FakeTarget t;
  t.clocks = {1005, 1005};
  EXPECT_TRUE(run_protocol(t, {}, 0).stable);
  FakeTarget u;
  u.clocks = {1005, 900, 1005, 1005};
  const auto r = run_protocol(u, {}, 0);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(r.clock_mhz, 1005);
}

TEST(Protocol, BadOptionsNameTheOption) {
  struct Case {
    ProtocolOptions o;
    int expected;
    std::string needle;
  };
  std::vector<Case> cases;
  auto add = [&](auto change, int expected, const std::string& needle) {
    ProtocolOptions o;
    change(o);
    cases.push_back({o, expected, needle});
  };
  add([](ProtocolOptions& o) { o.window_s = 0; }, 0, "window_s");
  add([](ProtocolOptions& o) { o.window_s = -1; }, 0, "window_s");
  add([](ProtocolOptions& o) { o.window_s = NAN; }, 0, "window_s");
  add([](ProtocolOptions& o) { o.cooldown_s = -0.5; }, 0, "cooldown_s");
  add([](ProtocolOptions& o) { o.max_attempts = 0; }, 0, "max_attempts");
  add([](ProtocolOptions& o) { o.warmup_iterations = -1; }, 0, "warmup_iterations");
  add([](ProtocolOptions& o) { o.calibration_iterations = 0; }, 0, "calibration_iterations");
  add([](ProtocolOptions& o) { o.max_clock_drift_mhz = -1; }, 0, "max_clock_drift_mhz");
  add([](ProtocolOptions&) {}, -1, "expected_clock_mhz");
  for (const auto& c : cases) {
    FakeTarget t;
    try {
      run_protocol(t, c.o, c.expected);
      ADD_FAILURE() << "no error for " << c.needle;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(t.calls.empty()) << c.needle;  // validated before touching the device
  }
}

// ---- Against the emulator's thermal model.

struct ThermalFixture {
  Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  PartitionSet ps = partition_workload(w);
  EmulatorModel model{w.gpu()};
  const Partition& part = ps.partition("fwd_mlp");
  PartitionConfig config{1410, 24, part.slot_names().front()};
  ThermalParams params = thermal_params_for(w.gpu());
};

TEST(ProtocolThermal, StableWindowMatchesTheEmulator) {
  ThermalFixture f;
  ThermalTarget target(f.model, f.part, f.config, f.params, {8, std::nullopt});
  const auto r = run_protocol(target, {}, 1410);
  ASSERT_TRUE(r.stable) << r.note;
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.throttle_mask, 0u);
  EXPECT_EQ(r.clock_mhz, 1410);
  EXPECT_GE(r.window_s, 5.0);
  // The window heats the GPU: static power is above its catalogue value by the end.
  EXPECT_GT(r.temperature_after_c, r.temperature_before_c + 1.0);

  // Independently: the model's partition time and dynamic energy, plus static power at the
  // window's mean temperature under the linear leakage law.
  const SimResult sim = f.model.simulate_partition(f.part, f.config);
  const GpuSpec& g = f.w.gpu();
  const double t_ref = f.params.ambient_c + f.params.resistance_c_per_w * g.static_power_w;
  const double t_mean = 0.5 * (r.temperature_before_c + r.temperature_after_c);
  const double p_static = g.static_power_w * (1 + f.params.leakage_per_c * (t_mean - t_ref));
  const double expect_j = sim.dynamic_energy_j + p_static * sim.time_s;
  EXPECT_NEAR(r.time_s, sim.time_s, 1e-9 * sim.time_s);
  EXPECT_NEAR(r.energy_j, expect_j, 0.01 * expect_j);
  // The leakage matters: the catalogue static power alone misses by more than the agreement.
  const double naive_j = sim.dynamic_energy_j + g.static_power_w * sim.time_s;
  EXPECT_GT(std::abs(naive_j - expect_j), std::abs(r.energy_j - expect_j));
  // Energy is per GPU: the group's counter is 8 times one GPU's.
  ThermalTarget one(f.model, f.part, f.config, f.params);
  EXPECT_NEAR(run_protocol(one, {}, 1410).energy_j, r.energy_j, 1e-9 * r.energy_j);
}

TEST(ProtocolThermal, HotStartThrottlesAndIsRepeated) {
  ThermalFixture f;
  ThermalTarget target(f.model, f.part, f.config, f.params, {1, 95.0});
  const auto r = run_protocol(target, {}, 1410);
  ASSERT_TRUE(r.stable) << r.note;
  EXPECT_GT(r.attempts, 1);
  EXPECT_EQ(r.throttle_mask, 0u);
  EXPECT_EQ(r.clock_mhz, 1410);
  EXPECT_NE(r.note.find("attempt 1:"), std::string::npos) << r.note;
  EXPECT_NE(r.note.find("throttled (sw_thermal_slowdown)"), std::string::npos) << r.note;
  EXPECT_LT(r.temperature_before_c, f.params.throttle_temp_c);
  // The accepted window ran at the requested clock: its time is the model's, and its energy the
  // model's dynamic energy plus static power at its (warmer than a cold start's) temperature.
  const SimResult sim = f.model.simulate_partition(f.part, f.config);
  const double t_mean = 0.5 * (r.temperature_before_c + r.temperature_after_c);
  const double expect_j =
      sim.dynamic_energy_j + static_power_at_w(f.w.gpu(), f.params, t_mean) * sim.time_s;
  EXPECT_NEAR(r.time_s, sim.time_s, 1e-9 * sim.time_s);
  EXPECT_NEAR(r.energy_j, expect_j, 0.01 * expect_j);
}

TEST(ProtocolThermal, LowLimitAlwaysThrottlesAndEndsUnstable) {
  ThermalFixture f;
  f.params.throttle_temp_c = 35;  // below the idle steady state: no cool-down helps
  ThermalTarget target(f.model, f.part, f.config, f.params);
  ProtocolOptions o;
  o.max_attempts = 3;
  const auto r = run_protocol(target, o, 1410);
  EXPECT_FALSE(r.stable);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_NE(r.throttle_mask & nvml::kReasonSwThermalSlowdown, 0u);
  EXPECT_LT(r.clock_mhz, 1410);
  EXPECT_NE(r.note.find("attempt 3:"), std::string::npos) << r.note;
}

TEST(ProtocolThermal, ModelFollowsTheRcLaw) {
  ThermalFixture f;
  ThermalTarget t(f.model, f.part, f.config, f.params);
  const GpuSpec& g = f.w.gpu();
  const double t_ref = reference_temperature_c(g, f.params);
  EXPECT_NEAR(t.temperature_c(), t_ref, 1e-12);
  // Idle at the reference temperature is a steady state drawing the catalogue static power.
  const double e0 = t.energy_j();
  t.idle(10.0);
  EXPECT_NEAR(t.temperature_c(), t_ref, 1e-9);
  EXPECT_NEAR(t.energy_j() - e0, 10.0 * g.static_power_w, 1e-6);
  EXPECT_NEAR(t.now_s(), 10.0, 1e-9);
  // From a hot start, idle cooling follows exp(-k t / tau), k = 1 - R P0 c.
  ThermalTarget hot(f.model, f.part, f.config, f.params, {1, 80.0});
  hot.idle(7.0);
  const double k = 1 - f.params.resistance_c_per_w * g.static_power_w * f.params.leakage_per_c;
  EXPECT_NEAR(hot.temperature_c(), t_ref + (80.0 - t_ref) * std::exp(-k * 7.0 / 20.0), 1e-9);
  // Static power grows with temperature.
  EXPECT_GT(static_power_at_w(g, f.params, 80), static_power_at_w(g, f.params, 50));
  EXPECT_DOUBLE_EQ(static_power_at_w(g, f.params, t_ref), g.static_power_w);
  // Bad parameters are named.
  ThermalParams bad = f.params;
  bad.time_constant_s = 0;
  EXPECT_THROW(ThermalTarget(f.model, f.part, f.config, bad), InvalidInput);
  bad = f.params;
  bad.leakage_per_c = 1.0;  // thermal runaway
  EXPECT_THROW(ThermalTarget(f.model, f.part, f.config, bad), InvalidInput);
}

}  // namespace
}  // namespace kareus
