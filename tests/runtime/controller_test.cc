// The frequency controller process (kareus-freqd) and its client: the dry-run transition log,
// locks and resets through the fake NVML, start-up failures, cleanup when the client dies, and a
// client that never blocks on a stalled controller.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fakes/fake_nvml_util.h"
#include "kareus/runtime.h"

namespace kareus {
namespace {

using runtime::ControllerOptions;
using runtime::FrequencyController;
using test::FakeNvmlEnv;

struct Event {
  std::string kind;
  int freq_mhz;
  std::string reason;
};

std::vector<Event> read_events(const std::string& path) {
  std::vector<Event> out;
  std::istringstream in(test::read_file(path));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_GT(j.at("t_s").get<double>(), 1.6e9) << "t_s is seconds since the Unix epoch";
    out.push_back({j.at("event").get<std::string>(), j.at("freq_mhz").get<int>(),
                   j.value("reason", std::string())});
  }
  return out;
}

std::vector<std::pair<std::string, int>> kinds_and_clocks(const std::vector<Event>& events) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& e : events) out.emplace_back(e.kind, e.freq_mhz);
  return out;
}

// Stopping drops the targets still queued, so a test that wants every one applied waits for the
// log to show `count` events first.
void wait_for_events(const std::string& log, std::size_t count) {
  ASSERT_TRUE(test::wait_until([&] { return read_events(log).size() >= count; }))
      << "the controller applied only " << read_events(log).size() << " of " << count;
}

ControllerOptions dry_run_options(const std::string& log) {
  ControllerOptions o;
  o.dry_run = true;
  o.log_path = log;
  o.executable = KAREUS_FREQD;
  return o;
}

bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  // A zombie is gone for our purposes.
  const std::string stat = test::read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < stat.size() &&
         stat[close_paren + 2] == 'Z';
}

TEST(ControllerDryRun, LogsTheRequestedSequenceWithRepeatsCollapsed) {
  test::TempDir dir;
  const std::string log = dir.file("gpu3.jsonl");
  auto o = dry_run_options(log);
  o.gpu_index = 3;
  auto c = FrequencyController::start(o);
  EXPECT_GT(c->pid(), 0);
  for (int f : {1410, 1410, 1200, 1200, 1200, 900, 0, 0, 1410, 1005, 1005}) c->set_clock(f);
  wait_for_events(log, 6);
  c->stop();
  c->stop();  // idempotent
  const auto events = read_events(log);
  const std::vector<std::pair<std::string, int>> expected = {
      {"lock", 1410}, {"lock", 1200}, {"lock", 900}, {"reset", 0},
      {"lock", 1410}, {"lock", 1005}, {"reset", 0}};
  EXPECT_EQ(kinds_and_clocks(events), expected);
  ASSERT_EQ(events.size(), expected.size());
  EXPECT_EQ(events[3].reason, "request");
  EXPECT_EQ(events.back().reason, "eof");
  // Every line names the GPU, and time stamps never go backwards.
  double last_t_s = 0;
  std::istringstream in(test::read_file(log));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("gpu").get<int>(), 3);
    EXPECT_GE(j.at("t_s").get<double>(), last_t_s);
    last_t_s = j.at("t_s").get<double>();
  }
  EXPECT_THROW(c->set_clock(1200), Error) << "a stopped controller takes no targets";
}

TEST(ControllerDryRun, NoTargetsStillEndsWithAReset) {
  test::TempDir dir;
  auto c = FrequencyController::start(dry_run_options(dir.file("log.jsonl")));
  c.reset();  // destruction stops it
  const auto events = read_events(dir.file("log.jsonl"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, "reset");
}

// Only a socket's end-of-file means "stop, drop the queue": a file (a manual run's script) is
// applied in full before the final reset.
TEST(ControllerDryRun, AScriptInAFileIsAppliedInFull) {
  test::TempDir dir;
  const std::string script = dir.file("targets.bin"), log = dir.file("log.jsonl");
  {
    const std::int32_t targets[] = {1410, 1200, 0, 990};
    std::ofstream out(script, std::ios::binary);
    out.write(reinterpret_cast<const char*>(targets), sizeof targets);
  }
  std::string exe = KAREUS_FREQD, gpu = "--gpu", zero = "0", dry = "--dry-run", log_flag = "--log",
              log_path = log;
  char* argv[] = {exe.data(),      dry.data(),      gpu.data(), zero.data(),
                  log_flag.data(), log_path.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, script.c_str(), O_RDONLY, 0);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  const auto status = test::wait_child(pid);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  const auto events = read_events(log);
  const std::vector<std::pair<std::string, int>> expected = {
      {"lock", 1410}, {"lock", 1200}, {"reset", 0}, {"lock", 990}, {"reset", 0}};
  EXPECT_EQ(kinds_and_clocks(events), expected);
  ASSERT_EQ(events.size(), expected.size());
  EXPECT_EQ(events.back().reason, "eof");
}

TEST(ControllerStart, RejectsBadOptionsBeforeSpawning) {
  test::TempDir dir;
  ControllerOptions o = dry_run_options("");
  EXPECT_THROW(FrequencyController::start(o), InvalidInput) << "dry run needs a log";
  o = dry_run_options(dir.file("log.jsonl"));
  o.gpu_index = -1;
  EXPECT_THROW(FrequencyController::start(o), InvalidInput);
  o = dry_run_options(dir.file("log.jsonl"));
  o.executable = dir.file("no-such-kareus-freqd");
  try {
    FrequencyController::start(o);
    ADD_FAILURE() << "a missing executable must be an error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-kareus-freqd"), std::string::npos) << e.what();
  }
  auto c = FrequencyController::start(dry_run_options(dir.file("log.jsonl")));
  EXPECT_THROW(c->set_clock(-5), InvalidInput);
}

TEST(ControllerStart, FindsTheExecutableThroughTheEnvironment) {
  test::TempDir dir;
  auto o = dry_run_options(dir.file("log.jsonl"));
  o.executable.clear();
  setenv("KAREUS_FREQD", KAREUS_FREQD, 1);
  auto c = FrequencyController::start(o);
  unsetenv("KAREUS_FREQD");
  c->set_clock(1305);
  wait_for_events(dir.file("log.jsonl"), 1);
  c->stop();
  EXPECT_EQ(read_events(dir.file("log.jsonl")).at(0).freq_mhz, 1305);
}

TEST(ControllerStart, ReportsTheControllersOwnFailure) {
  FakeNvmlEnv env;
  ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.nvml_library = env.dir().file("no-such/libnvidia-ml.so.1");
  try {
    FrequencyController::start(o);
    ADD_FAILURE() << "NVML cannot load";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load NVML"), std::string::npos) << e.what();
  }
  o.nvml_library = env.library();
  o.gpu_index = 4;  // the fake has one device
  try {
    FrequencyController::start(o);
    ADD_FAILURE() << "GPU 4 does not exist";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("GPU index 4 is out of range"), std::string::npos)
        << e.what();
  }
}

TEST(ControllerNvml, LocksOnlyChangesAndResetsThroughNvml) {
  FakeNvmlEnv env;
  ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.nvml_library = env.library();
  o.log_path = env.dir().file("transitions.jsonl");
  auto c = FrequencyController::start(o);
  const std::string tag = "pid=" + std::to_string(c->pid()) + " ";
  for (int f : {1200, 1200, 900, 900, 1200}) c->set_clock(f);
  wait_for_events(o.log_path, 3);
  c->stop();
  const auto sets = env.grep({tag + "nvmlDeviceSetGpuLockedClocks"});
  ASSERT_EQ(sets.size(), 3u);
  EXPECT_NE(sets[0].find("min=1200 max=1200 rc=0"), std::string::npos) << sets[0];
  EXPECT_NE(sets[1].find("min=900 max=900 rc=0"), std::string::npos) << sets[1];
  EXPECT_NE(sets[2].find("min=1200 max=1200 rc=0"), std::string::npos) << sets[2];
  const int last_set =
      env.find({tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1200"}, env.find({tag, "min=900"}));
  const int reset = env.find({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"});
  EXPECT_GT(reset, last_set);
  EXPECT_EQ(env.grep({tag + "nvmlDeviceResetGpuLockedClocks"}).size(), 1u);
  EXPECT_GT(env.find({tag + "nvmlShutdown rc=0"}), reset);
  const std::vector<std::pair<std::string, int>> expected = {
      {"lock", 1200}, {"lock", 900}, {"lock", 1200}, {"reset", 0}};
  EXPECT_EQ(kinds_and_clocks(read_events(o.log_path)), expected);
}

TEST(ControllerNvml, PermissionDeniedIsLoggedAndTheControllerCarriesOn) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_DENY", "1");
  ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.nvml_library = env.library();
  o.log_path = env.dir().file("transitions.jsonl");
  auto c = FrequencyController::start(o);
  c->set_clock(1200);
  ASSERT_TRUE(
      test::wait_until([&] { return !env.grep({"nvmlDeviceSetGpuLockedClocks"}).empty(); }));
  c->stop();  // exits cleanly: the training job must not die of a missing privilege
  const std::string text = test::read_file(o.log_path);
  EXPECT_NE(text.find(R"("event": "error")"), std::string::npos) << text;
  EXPECT_NE(text.find("root"), std::string::npos) << text;
  const auto events = read_events(o.log_path);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, "reset");
  EXPECT_TRUE(env.grep({"nvmlDeviceResetGpuLockedClocks"}).empty())
      << "nothing was locked, so nothing is reset";
}

TEST(ControllerLifecycle, SigtermResetsAndExits) {
  FakeNvmlEnv env;
  ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.nvml_library = env.library();
  o.log_path = env.dir().file("transitions.jsonl");
  auto c = FrequencyController::start(o);
  const std::string tag = "pid=" + std::to_string(c->pid()) + " ";
  c->set_clock(1350);
  ASSERT_TRUE(test::wait_until([&] { return !env.grep({tag, "min=1350", "rc=0"}).empty(); }));
  kill(c->pid(), SIGTERM);
  ASSERT_TRUE(test::wait_until(
      [&] { return !env.grep({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}).empty(); }));
  try {
    c->stop();
    ADD_FAILURE() << "a controller ended by a signal does not exit with 0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exit code 143"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_events(o.log_path).back().reason, "signal");
}

TEST(ControllerLifecycle, KilledClientLeavesNoControllerBehind) {
  FakeNvmlEnv env;
  test::SubreaperScope reaper;  // the orphaned controller becomes our child
  ASSERT_TRUE(reaper.ok());
  const std::string log = env.dir().file("transitions.jsonl");
  test::Child client({KAREUS_CONTROLLER_HELPER, env.library(), log, "1125", "0"});
  const auto line = client.read_line();
  ASSERT_TRUE(line.has_value()) << "the client never started its controller";
  ASSERT_EQ(line->rfind("controller ", 0), 0u) << *line;
  const pid_t controller = static_cast<pid_t>(std::stol(line->substr(11)));
  const std::string tag = "pid=" + std::to_string(controller) + " ";
  ASSERT_TRUE(test::wait_until(
      [&] { return !env.grep({tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1125"}).empty(); }));
  kill(client.pid(), SIGKILL);
  client.wait();
  const auto status = test::wait_child(controller);
  ASSERT_TRUE(status.has_value()) << "the controller outlived its client";
  EXPECT_TRUE(process_gone(controller));
  const int set = env.find({tag + "nvmlDeviceSetGpuLockedClocks gpu=0 min=1125 max=1125 rc=0"});
  EXPECT_GT(env.find({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}, set), set);
  const auto events = read_events(log);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, "reset");
  // End-of-file and the parent-death signal race; either way the clock was reset.
  EXPECT_TRUE(events.back().reason == "eof" || events.back().reason == "parent_death")
      << events.back().reason;
}

TEST(ControllerClient, WritesNeverBlockAndTheNewestTargetWins) {
  test::TempDir dir;
  const std::string log = dir.file("log.jsonl");
  auto c = FrequencyController::start(dry_run_options(log));
  ASSERT_EQ(kill(c->pid(), SIGSTOP), 0);
  struct Resume {
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{c->pid()};
  using Clock = std::chrono::steady_clock;
  double slowest_s = 0;
  const auto start = Clock::now();
  constexpr int kTargets = 100000;
  for (int i = 0; i < kTargets; ++i) {
    const auto t0 = Clock::now();
    c->set_clock(1000 + i % 400);
    slowest_s = std::max(slowest_s, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  c->set_clock(777);  // the newest target, distinct from every earlier one
  const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%d set_clock calls to a stopped controller: %.3f s in all, slowest %.3f ms\n",
              kTargets + 1, total_s, slowest_s * 1e3);
  // A blocking send would hang here forever: the controller is stopped and its queue is full.
  // Only the total is bounded: one call's wall time on a loaded machine says nothing.
  EXPECT_LT(total_s, 20.0);
  kill(c->pid(), SIGCONT);
  ASSERT_TRUE(test::wait_until([&] {
    const auto events = read_events(log);
    return !events.empty() && events.back().kind == "lock" && events.back().freq_mhz == 777;
  })) << "the newest target never arrived";
  c->stop();
  const auto events = read_events(log);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2].freq_mhz, 777);
  EXPECT_EQ(events.back().kind, "reset");
  // The queue overflowed, so targets in between were dropped rather than queued without bound.
  EXPECT_LT(events.size(), static_cast<std::size_t>(kTargets));
}

TEST(ControllerClient, SetClockAfterTheControllerDiedThrows) {
  test::TempDir dir;
  auto c = FrequencyController::start(dry_run_options(dir.file("log.jsonl")));
  kill(c->pid(), SIGKILL);
  ASSERT_TRUE(test::wait_until([&] { return process_gone(c->pid()); }));
  try {
    c->set_clock(1200);
    ADD_FAILURE() << "a dead controller must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is gone"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->stop(), Error);
}

// The "gpu" of the log's first line.
int first_gpu(const std::string& log) {
  const std::string text = test::read_file(log);
  return nlohmann::json::parse(text.substr(0, text.find('\n'))).at("gpu").get<int>();
}

TEST(ControllerNvml, SelectsTheGpuByUuidOrPciBusId) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_DEVICES", "3");
  // The fake's buses run opposite to its indices: bus 0x70 is index 1.
  const std::pair<std::string, std::string> cases[] = {{"GPU-fake-0000-2", ""},
                                                       {"", "00000000:70:00.0"}};
  const int want_gpu[] = {2, 1};
  for (int k = 0; k < 2; ++k) {
    ControllerOptions o;
    o.executable = KAREUS_FREQD;
    o.nvml_library = env.library();
    o.gpu_uuid = cases[k].first;
    o.pci_bus_id = cases[k].second;
    o.log_path = env.dir().file("transitions" + std::to_string(k) + ".jsonl");
    auto c = FrequencyController::start(o);
    const std::string tag = "pid=" + std::to_string(c->pid()) + " ";
    c->set_clock(1100);
    wait_for_events(o.log_path, 1);
    c->stop();
    const std::string gpu = "gpu=" + std::to_string(want_gpu[k]);
    EXPECT_EQ(env.grep({tag + "nvmlDeviceSetGpuLockedClocks " + gpu + " min=1100"}).size(), 1u)
        << k;
    EXPECT_EQ(env.grep({tag + "nvmlDeviceResetGpuLockedClocks " + gpu + " rc=0"}).size(), 1u) << k;
    EXPECT_EQ(env.grep({tag + "nvmlDeviceSetGpuLockedClocks gpu=0"}).size(), 0u) << k;
    EXPECT_EQ(first_gpu(o.log_path), want_gpu[k]) << "the log names NVML's index";
  }
  // A dry run resolves the UUID too (read-only), so a typo fails at start.
  auto d = dry_run_options(env.dir().file("dry.jsonl"));
  d.nvml_library = env.library();
  d.gpu_uuid = "GPU-fake-0000-1";
  auto c = FrequencyController::start(d);
  c->set_clock(1005);
  wait_for_events(d.log_path, 1);
  c->stop();
  EXPECT_EQ(first_gpu(d.log_path), 1);
  d.gpu_uuid = "GPU-typo";
  try {
    FrequencyController::start(d);
    ADD_FAILURE() << "an unknown UUID must be refused";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("GPU-typo"), std::string::npos) << e.what();
  }
  d.pci_bus_id = "00000000:70:00.0";
  EXPECT_THROW(FrequencyController::start(d), InvalidInput) << "UUID and bus id together";
}

TEST(ControllerLifecycle, StopDropsQueuedTargetsAndResetsAtOnce) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_LOCK_DELAY_MS", "50");  // a slow driver: 50 ms per lock
  ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.nvml_library = env.library();
  o.log_path = env.dir().file("transitions.jsonl");
  auto c = FrequencyController::start(o);
  const std::string tag = "pid=" + std::to_string(c->pid()) + " ";
  constexpr int kTargets = 100;  // 5 s of locks if all were applied
  for (int i = 0; i < kTargets; ++i) c->set_clock(900 + 15 * (i % 2));
  ASSERT_TRUE(test::wait_until([&] { return !env.grep({tag, "SetGpuLockedClocks"}).empty(); }));
  const auto t0 = std::chrono::steady_clock::now();
  c->stop();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("stop() with a backlog of %d slow locks: %.3f s\n", kTargets, stop_s);
  EXPECT_LT(stop_s, 2.0) << "stop() waited for the backlog";
  const auto events = read_events(o.log_path);
  ASSERT_FALSE(events.empty());
  EXPECT_LT(events.size(), static_cast<std::size_t>(kTargets / 2)) << "the backlog was applied";
  EXPECT_EQ(events.back().kind, "reset");
  EXPECT_EQ(events.back().reason, "eof");
  EXPECT_EQ(env.grep({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}).size(), 1u);
}

TEST(ControllerLifecycle, SigtermIsSeenBetweenQueuedLocks) {
  FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_LOCK_DELAY_MS", "50");
  ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.nvml_library = env.library();
  o.log_path = env.dir().file("transitions.jsonl");
  auto c = FrequencyController::start(o);
  const std::string tag = "pid=" + std::to_string(c->pid()) + " ";
  for (int i = 0; i < 100; ++i) c->set_clock(900 + 15 * (i % 2));
  ASSERT_TRUE(test::wait_until([&] { return !env.grep({tag, "SetGpuLockedClocks"}).empty(); }));
  kill(c->pid(), SIGTERM);
  ASSERT_TRUE(test::wait_until(
      [&] { return !env.grep({tag + "nvmlDeviceResetGpuLockedClocks gpu=0 rc=0"}).empty(); }, 2.0))
      << "the signal waited behind the queued locks";
  EXPECT_THROW(c->stop(), Error) << "exit code 143";
  const auto events = read_events(o.log_path);
  EXPECT_LT(events.size(), 50u);
  EXPECT_EQ(events.back().reason, "signal");
}

TEST(ControllerLifecycle, RunsInItsOwnProcessGroup) {
  test::TempDir dir;
  auto c = FrequencyController::start(dry_run_options(dir.file("log.jsonl")));
  // A terminal's Ctrl-C goes to the foreground process group, the trainer's, and not to it.
  EXPECT_EQ(getpgid(c->pid()), c->pid());
  EXPECT_NE(getpgid(c->pid()), getpgrp());
  kill(-getpgid(c->pid()), SIGINT);  // what the terminal does to a group
  ASSERT_TRUE(test::wait_until([&] { return process_gone(c->pid()); }));
  EXPECT_THROW(c->stop(), Error) << "it ended by the signal, so not with exit code 0";
  EXPECT_EQ(read_events(dir.file("log.jsonl")).back().reason, "signal");
}

TEST(ControllerClient, AForkedChildOnlyClosesItsCopy) {
  test::TempDir dir;
  const std::string log = dir.file("log.jsonl");
  auto c = FrequencyController::start(dry_run_options(log));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A data-loader worker that exits: its copy of the handle must leave the parent's
    // controller alone (no shutdown of the shared channel, no signal, no wait).
    try {
      c->stop();
      c.reset();
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  const auto status = test::wait_child(child);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  EXPECT_FALSE(process_gone(c->pid())) << "the child stopped the parent's controller";
  c->set_clock(1230);
  wait_for_events(log, 1);
  c->stop();  // exits cleanly: the parent still owns it
  const auto events = read_events(log);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].freq_mhz, 1230);
  EXPECT_EQ(events[1].reason, "eof");
}

}  // namespace
}  // namespace kareus
