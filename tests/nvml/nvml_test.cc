// The NVML layer against the fake libnvidia-ml.so.1 (tests/fakes/fake_nvml.cc): unit conversion,
// the error table, read-only mode, and the reset of locked clocks on every way out of a process.
#include "kareus/nvml.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "fakes/fake_nvml_util.h"

namespace kareus {
namespace {

namespace nvml = kareus::nvml;
using test::Child;
using test::FakeNvmlEnv;

std::unique_ptr<nvml::Nvml> open_fake(nvml::Access access = nvml::Access::kReadOnly,
                                      const std::string& library = KAREUS_FAKE_NVML) {
  return nvml::open({access, library});
}

// The most derived class of an NVML error, by name.
std::string error_class(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const nvml::NvmlNotSupported&) {
    return "NotSupported";
  } catch (const nvml::NvmlNoPermission&) {
    return "NoPermission";
  } catch (const nvml::NvmlGpuLost&) {
    return "GpuLost";
  } catch (const nvml::NvmlUnavailable&) {
    return "Unavailable";
  } catch (const nvml::NvmlReadOnly&) {
    return "ReadOnly";
  } catch (const nvml::NvmlError&) {
    return "NvmlError";
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "none";
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(NvmlLayer, ReadsDeviceFacts) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_DEVICES", "2");
  env.set("KAREUS_FAKE_NVML_NAME", "NVIDIA H100 80GB HBM3");
  env.set("KAREUS_FAKE_NVML_TEMP_C", "67");
  env.set("KAREUS_FAKE_NVML_SM_CLOCK_MHZ", "1305");
  env.set("KAREUS_FAKE_NVML_MAX_CLOCK_MHZ", "1980");
  auto lib = open_fake();
  EXPECT_EQ(lib->access(), nvml::Access::kReadOnly);
  EXPECT_EQ(lib->device_count(), 2);
  EXPECT_EQ(lib->driver_version(), "999.99-fake");
  auto& d = lib->device(1);
  EXPECT_EQ(d.index(), 1);
  EXPECT_EQ(d.name(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(d.uuid(), "GPU-fake-0000-1");
  EXPECT_DOUBLE_EQ(d.temperature_c(), 67.0);
  EXPECT_EQ(d.sm_clock_mhz(), 1305);
  EXPECT_EQ(d.max_sm_clock_mhz(), 1980);
  EXPECT_EQ(&lib->device(1), &d) << "devices are owned and reused by the Nvml object";
  // The sensor and clock type the layer asks for: NVML_TEMPERATURE_GPU = 0, NVML_CLOCK_SM = 1.
  EXPECT_EQ(env.grep({"nvmlDeviceGetTemperature gpu=1 sensor=0 rc=0"}).size(), 1u);
  EXPECT_EQ(env.grep({"nvmlDeviceGetClockInfo gpu=1 type=1 rc=0"}).size(), 1u);
}

TEST(NvmlLayer, SupportedClocksAscendingAtHighestMemoryClock) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_MAX_CLOCK_MHZ", "1410");
  auto lib = open_fake();
  const auto clocks = lib->device(0).supported_sm_clocks_mhz();
  // The fake lists 1410, 1395, ..., 210 (descending, as NVML does) at memory 1215 MHz.
  ASSERT_EQ(clocks.size(), static_cast<std::size_t>((1410 - 210) / 15 + 1));
  for (std::size_t i = 0; i < clocks.size(); ++i) EXPECT_EQ(clocks[i], 210 + 15 * int(i));
  EXPECT_EQ(env.grep({"nvmlDeviceGetSupportedGraphicsClocks", "memory_mhz=1215"}).size(), 1u);
  EXPECT_TRUE(env.grep({"memory_mhz=405"}).empty());
}

TEST(NvmlLayer, SupportedClocksGrowTheBufferWhenNvmlAsks) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_MAX_CLOCK_MHZ", std::to_string(210 + 15 * 200));  // 201 clocks
  auto lib = open_fake();
  const auto clocks = lib->device(0).supported_sm_clocks_mhz();
  ASSERT_EQ(clocks.size(), 201u);
  EXPECT_EQ(clocks.front(), 210);
  EXPECT_EQ(clocks.back(), 3210);
  // First call answered INSUFFICIENT_SIZE (7), the retry succeeded.
  EXPECT_EQ(env.grep({"nvmlDeviceGetSupportedGraphicsClocks", "rc=7"}).size(), 1u);
}

TEST(NvmlLayer, EnergyCounterInJoulesAndPowerInWatts) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "123456,125956");
  env.set("KAREUS_FAKE_NVML_POWER_W", "212.5");
  auto lib = open_fake();
  auto& d = lib->device(0);
  EXPECT_DOUBLE_EQ(d.total_energy_j(), 123.456);
  EXPECT_DOUBLE_EQ(d.total_energy_j(), 125.956);
  EXPECT_DOUBLE_EQ(d.total_energy_j(), 125.956) << "the last scripted reading repeats";
  EXPECT_DOUBLE_EQ(d.power_w(), 212.5);
}

TEST(NvmlLayer, EnergyDeltaFollowsPowerOverRealTime) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_POWER_W", "100");
  auto lib = open_fake();
  auto& d = lib->device(0);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const double e0_j = d.total_energy_j();
  const auto t1 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t2 = Clock::now();
  const double e1_j = d.total_energy_j();
  const auto t3 = Clock::now();
  const auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  // The fake's counter is 100 W times its own elapsed time, truncated to whole mJ.
  EXPECT_GE(e1_j - e0_j, 100.0 * s(t1, t2) - 0.001);
  EXPECT_LE(e1_j - e0_j, 100.0 * s(t0, t3) + 0.001);
}

TEST(NvmlLayer, ClockEventReasons) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_REASONS", "0x24");
  {
    auto lib = open_fake();
    const auto r = lib->device(0).clock_event_reasons();
    EXPECT_EQ(r.mask, 0x24u);
    EXPECT_EQ(r.describe(), "sw_power_cap|sw_thermal_slowdown");
    EXPECT_TRUE(r.throttled());
    EXPECT_EQ(env.grep({"nvmlDeviceGetCurrentClocksEventReasons"}).size(), 1u);
  }
  // A driver without the "event reasons" spelling answers through the "throttle" one.
  FakeNvmlEnv old_env(KAREUS_FAKE_NVML_OLD);
  old_env.set("KAREUS_FAKE_NVML_REASONS", "0x40");
  auto lib = open_fake(nvml::Access::kReadOnly, KAREUS_FAKE_NVML_OLD);
  const auto r = lib->device(0).clock_event_reasons();
  EXPECT_EQ(r.describe(), "hw_thermal_slowdown");
  EXPECT_EQ(old_env.grep({"nvmlDeviceGetCurrentClocksThrottleReasons", "rc=0"}).size(), 1u);
  EXPECT_TRUE(old_env.grep({"nvmlDeviceGetCurrentClocksEventReasons"}).empty());
}

TEST(NvmlLayer, ClockEventReasonBits) {
  const std::pair<std::uint64_t, const char*> bits[] = {
      {0x1, "gpu_idle"},
      {0x2, "applications_clocks_setting"},
      {0x4, "sw_power_cap"},
      {0x8, "hw_slowdown"},
      {0x10, "sync_boost"},
      {0x20, "sw_thermal_slowdown"},
      {0x40, "hw_thermal_slowdown"},
      {0x80, "hw_power_brake_slowdown"},
      {0x100, "display_clock_setting"},
  };
  const std::set<std::uint64_t> biasing = {0x4, 0x8, 0x20, 0x40, 0x80};
  for (const auto& [bit, name] : bits) {
    nvml::ClockEventReasons r{bit};
    EXPECT_EQ(r.describe(), name);
    EXPECT_EQ(r.throttled(), biasing.count(bit) == 1) << name;
  }
  EXPECT_EQ(nvml::ClockEventReasons{0}.describe(), "none");
  EXPECT_FALSE(nvml::ClockEventReasons{0}.throttled());
  EXPECT_EQ((nvml::ClockEventReasons{0x1 | 0x4000}.describe()), "gpu_idle|0x4000");
  EXPECT_FALSE((nvml::ClockEventReasons{0x1 | 0x2 | 0x10 | 0x100}.throttled()));
}

TEST(NvmlErrors, TableMapsEachCodeToItsClass) {
  const std::pair<int, const char*> table[] = {
      {1, "NvmlError"},     {2, "NvmlError"},  {3, "NotSupported"}, {4, "NoPermission"},
      {9, "Unavailable"},   {10, "NvmlError"}, {12, "Unavailable"}, {13, "Unavailable"},
      {15, "GpuLost"},      {16, "GpuLost"},   {17, "Unavailable"}, {18, "Unavailable"},
      {24, "NotSupported"}, {28, "GpuLost"},   {999, "NvmlError"},  {4242, "NvmlError"},
  };
  for (const auto& [code, expected] : table) {
    EXPECT_EQ(error_class([&] { nvml::check(code, "call(gpu 0)"); }), expected) << code;
    try {
      nvml::check(code, "call(gpu 0)");
    } catch (const nvml::NvmlError& e) {
      EXPECT_EQ(e.code(), code);
    }
  }
  EXPECT_EQ(error_class([] { nvml::check(0, "ok"); }), "none");
  const std::string lost = message_of([] { nvml::check(15, "nvmlDeviceGetPowerUsage(gpu 3)"); });
  EXPECT_NE(lost.find("nvmlDeviceGetPowerUsage(gpu 3)"), std::string::npos) << lost;
  EXPECT_NE(lost.find("NVML_ERROR_GPU_IS_LOST (15)"), std::string::npos) << lost;
  const std::string mismatch = message_of([] { nvml::check(18, "nvmlInit_v2"); });
  EXPECT_NE(mismatch.find("NVML_ERROR_LIB_RM_VERSION_MISMATCH"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("reboot"), std::string::npos) << mismatch;
  const std::string denied = message_of([] { nvml::check(4, "nvmlDeviceSetGpuLockedClocks"); });
  EXPECT_NE(denied.find("root"), std::string::npos) << denied;
  EXPECT_NE(denied.find("--allow-clock-control"), std::string::npos) << denied;
}

TEST(NvmlErrors, DeviceCallsRaiseTheTypedError) {
  FakeNvmlEnv env;
  const std::pair<int, const char*> cases[] = {{3, "NotSupported"},
                                               {4, "NoPermission"},
                                               {15, "GpuLost"},
                                               {18, "Unavailable"},
                                               {2, "NvmlError"}};
  for (const auto& [code, expected] : cases) {
    env.set("KAREUS_FAKE_NVML_FAIL",
            "nvmlDeviceGetPowerUsage=" + std::to_string(code) +
                ",nvmlDeviceGetTotalEnergyConsumption=" + std::to_string(code));
    auto again = open_fake();  // the fake reads its knobs at nvmlInit_v2
    auto& dev = again->device(0);
    EXPECT_EQ(error_class([&] { dev.power_w(); }), expected) << code;
    EXPECT_EQ(error_class([&] { dev.total_energy_j(); }), expected) << code;
    const std::string m = message_of([&] { dev.power_w(); });
    EXPECT_NE(m.find("nvmlDeviceGetPowerUsage(gpu 0)"), std::string::npos) << m;
  }
  // A code the table does not know quotes the driver's nvmlErrorString.
  env.set("KAREUS_FAKE_NVML_FAIL", "nvmlDeviceGetPowerUsage=4242");
  auto again = open_fake();
  const std::string m = message_of([&] { again->device(0).power_w(); });
  EXPECT_NE(m.find("NVML error 4242: fake NVML error"), std::string::npos) << m;
}

TEST(NvmlErrors, InitFailureIsTyped) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_FAIL", "nvmlInit_v2=9");
  const std::string m = message_of([] { open_fake(); });
  EXPECT_EQ(error_class([] { open_fake(); }), "Unavailable");
  EXPECT_NE(m.find("NVML_ERROR_DRIVER_NOT_LOADED"), std::string::npos) << m;
}

TEST(NvmlErrors, NoPermissionOnLockNamesRootAndTheFlag) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_DENY", "1");
  {
    auto lib = open_fake(nvml::Access::kClockControl);
    nvml::ClockGuard guard(*lib);
    const std::string m = message_of([&] { guard.lock(0, 1200); });
    EXPECT_EQ(error_class([&] { guard.lock(0, 1200); }), "NoPermission");
    EXPECT_NE(m.find("nvmlDeviceSetGpuLockedClocks(gpu 0)"), std::string::npos) << m;
    EXPECT_NE(m.find("root"), std::string::npos) << m;
    EXPECT_NE(m.find("--allow-clock-control"), std::string::npos) << m;
    EXPECT_EQ(guard.locked_mhz(0), 0);
  }
  // A lock that failed holds nothing, so nothing is reset.
  EXPECT_EQ(env.grep({"nvmlDeviceSetGpuLockedClocks", "rc=4"}).size(), 2u);
  EXPECT_TRUE(env.grep({"nvmlDeviceResetGpuLockedClocks"}).empty());
}

TEST(NvmlLoad, MissingLibraryIsUnavailable) {
  FakeNvmlEnv env;
  const std::string path = env.dir().file("no-such/libnvidia-ml.so.1");
  EXPECT_EQ(error_class([&] { nvml::open({nvml::Access::kReadOnly, path}); }), "Unavailable");
  const std::string m = message_of([&] { nvml::open({nvml::Access::kReadOnly, path}); });
  EXPECT_NE(m.find("cannot load NVML from '" + path + "'"), std::string::npos) << m;
  EXPECT_NE(m.find("driver"), std::string::npos) << m;
  // With no path in the options, $KAREUS_NVML_LIBRARY decides.
  env.set("KAREUS_NVML_LIBRARY", path);
  const std::string from_env = message_of([] { nvml::open(); });
  EXPECT_NE(from_env.find(path), std::string::npos) << from_env;
}

TEST(NvmlLoad, LibraryWithoutNvmlSymbolsIsUnavailable) {
  const std::string m = message_of([] { nvml::open({nvml::Access::kReadOnly, "libm.so.6"}); });
  EXPECT_EQ(error_class([] { nvml::open({nvml::Access::kReadOnly, "libm.so.6"}); }), "Unavailable");
  EXPECT_NE(m.find("lacks nvmlInit_v2"), std::string::npos) << m;
}

TEST(NvmlLoad, DeviceIndexOutOfRangeIsInvalidInput) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_DEVICES", "2");
  auto lib = open_fake();
  EXPECT_THROW(lib->device(2), InvalidInput);
  EXPECT_THROW(lib->device(-1), InvalidInput);
  const std::string m = message_of([&] { lib->device(5); });
  EXPECT_NE(m.find("GPU index 5"), std::string::npos) << m;
  EXPECT_NE(m.find("2 device(s)"), std::string::npos) << m;
}

TEST(NvmlReadOnly, SettersThrowBeforeReachingNvml) {
  FakeNvmlEnv env;
  {
    auto lib = open_fake(nvml::Access::kReadOnly);
    auto& d = lib->device(0);
    EXPECT_THROW(d.lock_sm_clock(1200, 1200), nvml::NvmlReadOnly);
    EXPECT_THROW(d.reset_sm_clock(), nvml::NvmlReadOnly);
    nvml::ClockGuard guard(*lib);
    EXPECT_THROW(guard.lock(0, 1005), nvml::NvmlReadOnly);
    const std::string m = message_of([&] { d.lock_sm_clock(1200, 1200); });
    EXPECT_NE(m.find("read-only"), std::string::npos) << m;
    EXPECT_NE(m.find("--allow-clock-control"), std::string::npos) << m;
    // Readers still work.
    EXPECT_EQ(d.sm_clock_mhz(), 1410);
  }
  EXPECT_FALSE(env.grep({"nvmlDeviceGetClockInfo"}).empty()) << "the log is being written";
  EXPECT_TRUE(env.grep({"nvmlDeviceSetGpuLockedClocks"}).empty());
  EXPECT_TRUE(env.grep({"nvmlDeviceResetGpuLockedClocks"}).empty());
}

TEST(NvmlClockGuard, LocksOnlyOnChangeAndResetsOnDestruction) {
  FakeNvmlEnv env;
  auto lib = open_fake(nvml::Access::kClockControl);
  {
    nvml::ClockGuard guard(*lib);
    guard.lock(0, 1200);
    guard.lock(0, 1200);
    EXPECT_EQ(guard.locked_mhz(0), 1200);
    EXPECT_EQ(lib->device(0).sm_clock_mhz(), 1200) << "the fake runs at the locked clock";
    guard.lock(0, 1005);
    EXPECT_THROW(guard.lock(0, 0), InvalidInput);
    EXPECT_EQ(env.grep({"nvmlDeviceSetGpuLockedClocks"}).size(), 2u);
    EXPECT_TRUE(env.grep({"nvmlDeviceResetGpuLockedClocks"}).empty());
  }
  EXPECT_EQ(env.grep({"nvmlDeviceSetGpuLockedClocks gpu=0 min=1200 max=1200 rc=0"}).size(), 1u);
  EXPECT_EQ(env.grep({"nvmlDeviceSetGpuLockedClocks gpu=0 min=1005 max=1005 rc=0"}).size(), 1u);
  EXPECT_EQ(env.grep({"nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}).size(), 1u);
  EXPECT_EQ(lib->device(0).sm_clock_mhz(), 1410);
}

TEST(NvmlClockGuard, ResetsWhenAnExceptionUnwinds) {
  FakeNvmlEnv env;
  auto lib = open_fake(nvml::Access::kClockControl);
  try {
    nvml::ClockGuard guard(*lib);
    guard.lock(0, 900);
    throw std::runtime_error("step failed");
  } catch (const std::runtime_error&) {
  }
  const int set = env.find({"nvmlDeviceSetGpuLockedClocks gpu=0 min=900 max=900 rc=0"});
  ASSERT_GE(set, 0);
  EXPECT_GT(env.find({"nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}, set), set);
}

TEST(NvmlClockGuard, ClosingNvmlResetsRawLocksBeforeShutdown) {
  FakeNvmlEnv env;
  {
    auto lib = open_fake(nvml::Access::kClockControl);
    lib->device(0).lock_sm_clock(1100, 1300);
  }
  const int reset = env.find({"nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"});
  ASSERT_GE(reset, 0);
  EXPECT_GT(env.find({"nvmlShutdown rc=0"}, reset), reset);
}

TEST(NvmlSelect, ByUuidAndPciBusIdFindTheDeviceWhateverTheIndexOrder) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_DEVICES", "3");
  auto lib = open_fake();
  // The fake numbers buses in reverse index order: bus 0x60 is index 2.
  EXPECT_EQ(lib->device_by_pci_bus_id("00000000:60:00.0").index(), 2);
  EXPECT_EQ(lib->device_by_pci_bus_id("0000:80:00.0").index(), 0);
  EXPECT_EQ(lib->device_by_pci_bus_id("70:00.0").index(), 1);
  EXPECT_EQ(lib->device_by_uuid("GPU-fake-0000-1").index(), 1);
  EXPECT_EQ(lib->device_by_uuid(lib->device(2).uuid()).index(), 2);
  EXPECT_EQ(&lib->device_by_uuid("GPU-fake-0000-0"), &lib->device(0)) << "one Device per GPU";
  const std::string m = message_of([&] { lib->device_by_uuid("GPU-nope"); });
  EXPECT_NE(m.find("GPU-nope"), std::string::npos) << m;
  EXPECT_THROW(lib->device_by_uuid("GPU-nope"), InvalidInput);
  EXPECT_THROW(lib->device_by_pci_bus_id("00000000:50:00.0"), InvalidInput);
  EXPECT_THROW(lib->device_by_pci_bus_id("not a bus id"), InvalidInput);
  EXPECT_THROW(lib->device_by_uuid(""), InvalidInput);
}

TEST(NvmlClockGuard, FailedRelockKeepsTheOldLockRegisteredForReset) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_REJECT_MHZ", "900");
  {
    auto lib = open_fake(nvml::Access::kClockControl);
    auto& d = lib->device(0);
    EXPECT_THROW(d.lock_sm_clock(900, 900), nvml::NvmlNotSupported);
    EXPECT_FALSE(d.lock_registered()) << "a failed first lock holds nothing";
    d.lock_sm_clock(1200, 1200);
    EXPECT_THROW(d.lock_sm_clock(900, 900), nvml::NvmlNotSupported);
    EXPECT_TRUE(d.lock_registered()) << "the 1200 MHz lock is still there";
    EXPECT_EQ(d.sm_clock_mhz(), 1200);
  }
  // Closing NVML resets the surviving lock.
  const int failed = env.find({"nvmlDeviceSetGpuLockedClocks gpu=0 min=900 max=900 rc=24"});
  ASSERT_GE(failed, 0);
  const int second =
      env.find({"nvmlDeviceSetGpuLockedClocks gpu=0 min=900 max=900 rc=24"}, failed + 1);
  EXPECT_GT(env.find({"nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}, second), second);
}

// --- resets in a separate process, as a training job would need them ---

std::string pid_tag(pid_t pid) { return "pid=" + std::to_string(pid) + " "; }

// Runs the helper in `mode` and returns its pid after checking the lock and the reset in the log.
void expect_helper_resets(const std::string& mode, int expected_exit) {
  FakeNvmlEnv env;
  Child helper({KAREUS_NVML_LOCK_HELPER, mode, "1155"});
  ASSERT_GT(helper.pid(), 0);
  const auto line = helper.read_line();
  ASSERT_TRUE(line.has_value()) << mode;
  EXPECT_EQ(line->rfind("locked " + std::to_string(helper.pid()) + " pdeathsig=0", 0), 0u) << *line;
  const auto status = helper.wait();
  ASSERT_TRUE(status.has_value()) << mode << ": helper did not exit";
  ASSERT_TRUE(WIFEXITED(*status)) << mode;
  EXPECT_EQ(WEXITSTATUS(*status), expected_exit) << mode;
  const std::string tag = pid_tag(helper.pid());
  const int set = env.find({tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1155 max=1155 rc=0"});
  ASSERT_GE(set, 0) << mode;
  EXPECT_GT(env.find({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}, set), set) << mode;
  EXPECT_EQ(env.grep({tag + "nvmlDeviceResetGpuLockedClocks"}).size(), 1u) << mode;
}

TEST(NvmlReset, OnNormalReturn) { expect_helper_resets("return", 0); }
TEST(NvmlReset, OnExitThroughAtexit) { expect_helper_resets("exit", 0); }
TEST(NvmlReset, OnException) { expect_helper_resets("throw", 0); }

TEST(NvmlReset, OnSigtermSigintSighup) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    FakeNvmlEnv env;
    Child helper({KAREUS_NVML_LOCK_HELPER, "sleep", "1200"});
    ASSERT_TRUE(helper.read_line().has_value()) << sig;
    kill(helper.pid(), sig);
    const auto status = helper.wait();
    ASSERT_TRUE(status.has_value()) << sig;
    // The handler resets, then re-raises: the process still dies of the signal.
    ASSERT_TRUE(WIFSIGNALED(*status)) << sig;
    EXPECT_EQ(WTERMSIG(*status), sig);
    const std::string tag = pid_tag(helper.pid());
    const int set = env.find({tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1200 max=1200 rc=0"});
    ASSERT_GE(set, 0) << sig;
    EXPECT_GT(env.find({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}, set), set) << sig;
  }
}

// A host handler that does not end the process: the layer's handler reset the clock, so the
// guard's "already locked at this clock" shortcut must not skip the next lock.
TEST(NvmlReset, RelockAfterASignalResetReachesNvml) {
  FakeNvmlEnv env;
  Child helper({KAREUS_NVML_LOCK_HELPER, "relock-after-signal", "1230"});
  ASSERT_TRUE(helper.read_line().has_value());
  const auto second = helper.read_line();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, "relocked");
  const auto status = helper.wait();
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  const std::string tag = pid_tag(helper.pid());
  const std::string set = tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1230 max=1230 rc=0";
  const std::string reset = tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0";
  const int first = env.find({set});
  ASSERT_GE(first, 0);
  const int signal_reset = env.find({reset}, first);
  ASSERT_GT(signal_reset, first);
  const int relock = env.find({set}, signal_reset);
  ASSERT_GT(relock, signal_reset) << "the second lock was skipped";
  EXPECT_GT(env.find({reset}, relock), relock) << "the guard resets the new lock on return";
}

// A library must not change how its host dies: without the opt-in, locking a clock leaves the
// process's parent-death signal alone.
TEST(NvmlReset, ParentDeathSignalIsOptIn) {
  for (const char* mode : {"sleep", "sleep-pdeath"}) {
    FakeNvmlEnv env;
    Child helper({KAREUS_NVML_LOCK_HELPER, mode, "1200"});
    const auto line = helper.read_line();
    ASSERT_TRUE(line.has_value()) << mode;
    const bool opted_in = std::string(mode) == "sleep-pdeath";
    EXPECT_NE(line->find(opted_in ? "pdeathsig=15" : "pdeathsig=0"), std::string::npos)
        << mode << ": " << *line;
    kill(helper.pid(), SIGTERM);
    const auto status = helper.wait();
    ASSERT_TRUE(status.has_value()) << mode;
    EXPECT_TRUE(WIFSIGNALED(*status)) << mode;
  }
}

TEST(NvmlReset, OnParentDeath) {
  FakeNvmlEnv env;
  test::SubreaperScope reaper;  // the orphaned helper becomes our child, so we can wait for it
  ASSERT_TRUE(reaper.ok());
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  // The parent-death reset is opt-in (Options::reset_on_parent_death), as kareus-freqd does.
  std::string helper_path = KAREUS_NVML_LOCK_HELPER, mode = "sleep-pdeath", freq = "1080";
  char* argv[] = {helper_path.data(), mode.data(), freq.data(), nullptr};
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    // The helper's parent: starts it and waits to be killed (async-signal-safe calls only).
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGTERM, SIG_DFL);
    if (fork() == 0) {
      execv(argv[0], argv);
      _exit(127);
    }
    for (;;) pause();
  }
  close(out[1]);
  std::string text;
  ASSERT_TRUE(test::wait_until([&] {
    pollfd p = {out[0], POLLIN, 0};
    if (poll(&p, 1, 10) > 0) {
      char buf[64];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n > 0) text.append(buf, static_cast<std::size_t>(n));
    }
    return text.find('\n') != std::string::npos;
  })) << "the helper never reported its lock";
  close(out[0]);
  ASSERT_EQ(text.rfind("locked ", 0), 0u) << text;
  EXPECT_NE(text.find("pdeathsig=15"), std::string::npos) << text;
  const pid_t helper = static_cast<pid_t>(std::stol(text.substr(7)));
  kill(middle, SIGKILL);
  test::wait_child(middle);
  // PR_SET_PDEATHSIG turns the parent's death into SIGTERM, which takes the reset path.
  const auto status = test::wait_child(helper);
  ASSERT_TRUE(status.has_value()) << "the helper outlived its parent";
  ASSERT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGTERM);
  const std::string tag = pid_tag(helper);
  const int set = env.find({tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1080 max=1080 rc=0"});
  ASSERT_GE(set, 0);
  EXPECT_GT(env.find({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}, set), set);
}

}  // namespace
}  // namespace kareus
