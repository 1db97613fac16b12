// The energy monitor (include/kareus/monitor.h) against the fake NVML's scripted energy counter
// (KAREUS_FAKE_NVML_ENERGY_MJ: successive readings in mJ, the last repeating): the expected
// energies are computed here by hand from the list and the reads each call makes (begin and end
// of every window: 2 per iteration, 2 more per instruction with per_instruction). Also the
// times-only mode, counter problems, call-order errors, the plan's per-GPU prediction and a
// killed process's file.
#include "kareus/monitor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fakes/fake_nvml_util.h"
#include "kareus/plan.h"
#include "test_util.h"

namespace kareus::runtime {
namespace {

using std::chrono::milliseconds;
using std::this_thread::sleep_for;

constexpr auto kF = InstructionKind::kForward;
constexpr auto kB = InstructionKind::kBackward;

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(test::read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// One iteration without instructions.
IterationRecord one_iteration(EnergyMonitor& m) {
  m.begin_iteration();
  return m.end_iteration();
}

MonitorOptions fake_options(const test::FakeNvmlEnv& env, const std::string& out = "") {
  MonitorOptions o;
  o.rank = 3;
  o.stage = 1;
  o.nvml_library = env.library();
  o.out_path = out;
  return o;
}

TEST(Monitor, EachIterationGetsItsCounterDifference) {
  test::FakeNvmlEnv env;
  // Two reads per iteration (begin, end): 1500-1000, 2600-1600, 2900-2700 J.
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "1000000,1500000,1600000,2600000,2700000,2900000");
  const std::string path = env.dir().file("rank3.jsonl");
  const double expected_j[] = {500, 1000, 200};
  double total_time = 0;
  {
    EnergyMonitor m(fake_options(env, path));
    EXPECT_TRUE(m.energy_available()) << m.times_only_reason();
    for (int i = 0; i < 3; ++i) {
      m.begin_iteration();
      sleep_for(milliseconds(5));
      const IterationRecord r = m.end_iteration();
      EXPECT_EQ(r.iteration, i);
      EXPECT_EQ((std::pair{r.rank, r.stage}), (std::pair{3, 1}));
      ASSERT_TRUE(r.energy_j.has_value()) << r.note;
      EXPECT_DOUBLE_EQ(*r.energy_j, expected_j[i]);
      EXPECT_GE(r.time_s, 0.005);
      EXPECT_DOUBLE_EQ(*r.avg_power_w, expected_j[i] / r.time_s);
      EXPECT_EQ(r.instructions, 0);
      EXPECT_EQ(r.gpu_uuid, "GPU-fake-0000-0");
      EXPECT_TRUE(r.note.empty()) << r.note;
      EXPECT_GT(r.start_unix_s, 1.6e9);  // seconds since the epoch (2020 or later)
      total_time += r.time_s;
    }
    const MonitorSummary s = m.summary();
    EXPECT_EQ(s.iterations, 3);
    EXPECT_EQ(s.energy_iterations, 3);
    EXPECT_DOUBLE_EQ(s.energy_j, 1700);
    EXPECT_DOUBLE_EQ(*s.energy_per_iteration_j(), 1700.0 / 3);
    EXPECT_DOUBLE_EQ(s.time_s, total_time);
    EXPECT_DOUBLE_EQ(*s.avg_power_w(), 1700 / total_time);
    EXPECT_FALSE(s.energy_per_token_j().has_value());  // no tokens given
    EXPECT_TRUE(s.note.empty()) << s.note;
    EXPECT_EQ(read_lines(path).size(), 3u) << "the summary is written at close only";
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["record"], "iteration");
    EXPECT_EQ(lines[i]["iteration"], i);
    EXPECT_DOUBLE_EQ(lines[i]["energy_j"].get<double>(), expected_j[i]);
    EXPECT_FALSE(lines[i].contains("note"));
  }
  EXPECT_EQ(lines[3]["record"], "summary");
  EXPECT_DOUBLE_EQ(lines[3]["energy_j"].get<double>(), 1700);
  EXPECT_DOUBLE_EQ(lines[3]["energy_per_iteration_j"].get<double>(), 1700.0 / 3);
  EXPECT_FALSE(lines[3].contains("prediction"));
  // Read-only: six counter reads, not one setter.
  EXPECT_EQ(env.grep({"nvmlDeviceGetTotalEnergyConsumption"}).size(), 6u);
  EXPECT_TRUE(env.grep({"SetGpuLockedClocks"}).empty());
  EXPECT_TRUE(env.grep({"ResetGpuLockedClocks"}).empty());
}

TEST(Monitor, PerInstructionWindowsAndBusyTime) {
  test::FakeNvmlEnv env;
  // iteration begin 0, F0 10..30, B0 31..71, iteration end 75 (J): F0 20 J, B0 40 J, 75 J.
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "0,10000,30000,31000,71000,75000");
  MonitorOptions o = fake_options(env, env.dir().file("r.jsonl"));
  o.per_instruction = true;
  EnergyMonitor m(o);
  m.begin_iteration();
  m.begin_instruction(kF, 0);
  sleep_for(milliseconds(10));
  const InstructionRecord f = m.end_instruction(kF, 0);
  m.begin_instruction(kB, 0, 0);
  sleep_for(milliseconds(20));
  const InstructionRecord b = m.end_instruction(kB, 0, 0);
  const IterationRecord it = m.end_iteration();
  EXPECT_DOUBLE_EQ(*f.energy_j, 20);
  EXPECT_DOUBLE_EQ(*b.energy_j, 40);
  EXPECT_DOUBLE_EQ(*b.avg_power_w, 40 / b.time_s);
  EXPECT_DOUBLE_EQ(*it.energy_j, 75);
  EXPECT_GE(f.time_s, 0.010);
  EXPECT_GE(b.time_s, 0.020);
  EXPECT_EQ(it.instructions, 2);
  EXPECT_DOUBLE_EQ(it.busy_time_s, f.time_s + b.time_s);
  EXPECT_LE(it.busy_time_s, it.time_s);
  m.close();
  const auto lines = read_lines(o.out_path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["record"], "instruction");
  EXPECT_EQ(lines[0]["kind"], "forward");
  EXPECT_EQ(lines[1]["kind"], "backward");
  EXPECT_EQ(lines[1]["microbatch"], 0);
  EXPECT_EQ(lines[1]["chunk"], 0);
  EXPECT_EQ(lines[1]["iteration"], 0);
  EXPECT_DOUBLE_EQ(lines[1]["energy_j"].get<double>(), 40);
  EXPECT_EQ(lines[2]["record"], "iteration");
  EXPECT_EQ(lines[3]["record"], "summary");
  EXPECT_EQ(lines[3]["instructions"], 2);
  EXPECT_EQ(m.records().size(), 4u);
  EXPECT_EQ(nlohmann::json::parse(m.records()[0]), lines[0]);
}

TEST(Monitor, WithoutPerInstructionOnlyTimesInstructions) {
  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "0,5000");
  EnergyMonitor m(fake_options(env));
  m.begin_iteration();
  for (int mb = 0; mb < 3; ++mb) {
    m.begin_instruction(kF, mb);
    const auto r = m.end_instruction(kF, mb);
    EXPECT_FALSE(r.energy_j.has_value());
  }
  const auto it = m.end_iteration();
  EXPECT_EQ(it.instructions, 3);
  EXPECT_DOUBLE_EQ(*it.energy_j, 5);  // the two iteration reads only
  EXPECT_EQ(m.records().size(), 1u);
  EXPECT_EQ(env.grep({"nvmlDeviceGetTotalEnergyConsumption"}).size(), 2u);
}

TEST(Monitor, TimesOnlyWithoutNvmlSaysSoEverywhere) {
  test::FakeNvmlEnv env;
  for (const bool asked : {false, true}) {
    MonitorOptions o = fake_options(env, env.dir().file(asked ? "missing.jsonl" : "off.jsonl"));
    o.nvml = asked;
    if (asked) o.nvml_library = "/no/such/libnvidia-ml.so.1";
    o.per_instruction = true;
    {
      EnergyMonitor m(o);
      EXPECT_FALSE(m.energy_available());
      const std::string why = asked ? "NVML unavailable: cannot load NVML from "
                                      "'/no/such/libnvidia-ml.so.1'"
                                    : "NVML not asked for (nvml = false)";
      EXPECT_NE(m.times_only_reason().find(why), std::string::npos) << m.times_only_reason();
      m.begin_iteration();
      m.begin_instruction(kB, 1, 0);
      const auto ins = m.end_instruction(kB, 1, 0);
      const auto it = m.end_iteration();
      EXPECT_FALSE(ins.energy_j.has_value());
      EXPECT_FALSE(it.energy_j.has_value());
      EXPECT_FALSE(it.avg_power_w.has_value());
      EXPECT_EQ(it.note, "times only: " + m.times_only_reason());
      EXPECT_EQ(ins.note, it.note);
      EXPECT_GT(it.time_s, 0);
      EXPECT_EQ(it.instructions, 1);
    }
    const auto lines = read_lines(o.out_path);
    ASSERT_EQ(lines.size(), 3u);
    for (const auto& j : lines) {
      EXPECT_TRUE(j["energy_j"].is_null()) << j;
      EXPECT_EQ(j["note"].get<std::string>().rfind("times only: ", 0), 0u) << j;
    }
    EXPECT_TRUE(lines[2]["energy_per_iteration_j"].is_null());
    EXPECT_TRUE(lines[2]["gpu_uuid"].is_null());
    EXPECT_EQ(lines[2]["energy_iterations"], 0);
  }
  EXPECT_TRUE(env.lines().empty()) << "the fake NVML was never called";
}

TEST(Monitor, CounterThatGoesDownIsANoteNotACrash) {
  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "5000000,4000000,4000000,4500000");
  EnergyMonitor m(fake_options(env));
  const auto bad = one_iteration(m);
  const auto good = one_iteration(m);
  EXPECT_FALSE(bad.energy_j.has_value());
  EXPECT_NE(bad.note.find("went down from 5000 J to 4000 J"), std::string::npos) << bad.note;
  EXPECT_DOUBLE_EQ(*good.energy_j, 500);
  const auto s = m.summary();
  EXPECT_EQ(s.energy_iterations, 1);
  EXPECT_DOUBLE_EQ(*s.energy_per_iteration_j(), 500);
  EXPECT_DOUBLE_EQ(*s.avg_power_w(), 500 / good.time_s) << "over the iterations with energy";
  EXPECT_NE(s.note.find("1 of 2 iterations have no energy"), std::string::npos) << s.note;
}

TEST(Monitor, FailedReadsAreNotesAndAMissingCounterMeansTimesOnly) {
  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_FAIL", "nvmlDeviceGetTotalEnergyConsumption=999");
  {
    EnergyMonitor m(fake_options(env));
    const auto r = one_iteration(m);
    EXPECT_FALSE(r.energy_j.has_value());
    EXPECT_NE(r.note.find("reading the energy counter failed"), std::string::npos) << r.note;
    EXPECT_TRUE(m.energy_available()) << "a failed read may be transient";
  }
  // NVML_ERROR_NOT_SUPPORTED (3): the GPU has no counter; every later record is times only.
  env.set("KAREUS_FAKE_NVML_FAIL", "nvmlDeviceGetTotalEnergyConsumption=3");
  EnergyMonitor m(fake_options(env));
  const auto r = one_iteration(m);
  EXPECT_FALSE(m.energy_available());
  EXPECT_NE(r.note.find("times only: this GPU has no total-energy counter"), std::string::npos)
      << r.note;
  EXPECT_NE(m.summary().note.find("times only"), std::string::npos);
}

TEST(Monitor, CallsOutOfOrderAreStateErrorsAndChangeNothing) {
  EnergyMonitor m([] {
    MonitorOptions o;
    o.nvml = false;
    return o;
  }());
  EXPECT_THROW(m.end_iteration(), StateError);
  EXPECT_THROW(m.begin_instruction(kF, 0), StateError);  // outside an iteration
  m.begin_iteration();
  EXPECT_THROW(m.begin_iteration(), StateError);
  EXPECT_THROW(m.end_instruction(kF, 0), StateError);
  EXPECT_THROW(m.begin_instruction(kF, -1), InvalidInput);
  m.begin_instruction(kF, 2, 1);
  try {
    m.end_instruction(kF, 2, 0);
    ADD_FAILURE() << "a wrong chunk was accepted";
  } catch (const StateError& e) {
    EXPECT_NE(std::string(e.what()).find("end of forward of micro-batch 2 (chunk 0), but forward "
                                         "of micro-batch 2 (chunk 1) is open"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.begin_instruction(kB, 0), StateError);
  EXPECT_THROW(m.end_iteration(), StateError);
  m.end_instruction(kF, 2, 1);
  EXPECT_EQ(m.end_iteration().instructions, 1);
  m.close();
  m.close();  // idempotent
  EXPECT_EQ(m.records().size(), 2u);
  EXPECT_THROW(m.begin_iteration(), StateError);
  EXPECT_EQ(m.summary().iterations, 1);
}

TEST(Monitor, BadOptionsAreRefused) {
  test::FakeNvmlEnv env;
  auto refused = [&](MonitorOptions o, const std::string& part) {
    try {
      EnergyMonitor m(o);
      ADD_FAILURE() << "accepted; expected: " << part;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  MonitorOptions o = fake_options(env);
  o.gpu_uuid = "GPU-typo";
  refused(o, "GPU-typo");
  o = fake_options(env);
  o.gpu_index = 5;
  refused(o, "GPU index 5 is out of range");
  o = fake_options(env);
  o.gpu_uuid = "GPU-fake-0000-0";
  o.pci_bus_id = "00000000:80:00.0";
  refused(o, "give one of them");
  o = fake_options(env, "/no/such/folder/r.jsonl");
  refused(o, "/no/such/folder/r.jsonl");
  o = fake_options(env);
  o.tokens_per_iteration = 0;
  refused(o, "tokens_per_iteration");
  // The bus id selects the device (the fake's bus order is the reverse of its index order).
  env.set("KAREUS_FAKE_NVML_DEVICES", "3");
  o = fake_options(env);
  o.pci_bus_id = "00000000:70:00.0";
  EnergyMonitor m(o);
  EXPECT_EQ(one_iteration(m).gpu_uuid, "GPU-fake-0000-1");
}

/// A 2-stage plan with 2 GPUs per stage, built by hand: static 50 W, 2 s, stage 0's
/// instructions 30 + 50 J, stage 1's 100 J (per GPU), energy_j 800 J.
Plan hand_plan() {
  Plan p;
  p.layout.tp = 2;
  p.layout.pp = 2;
  p.gpus = 4;
  p.iteration_time_s = 2;
  p.static_power_w = 50;
  p.energy_j = 800;
  p.stages.resize(2);
  p.stages[0].instructions.resize(2);
  p.stages[0].instructions[0].dynamic_energy_j = 30;
  p.stages[0].instructions[1].dynamic_energy_j = 50;
  p.stages[1].instructions.resize(1);
  p.stages[1].instructions[0].dynamic_energy_j = 100;
  return p;
}

TEST(Monitor, PlanPredictsEachGpusEnergyAndTheSummaryComparesIt) {
  const Plan p = hand_plan();
  // Static 50 W x 2 s = 100 J per GPU; the rest of energy_j, 800 - (2 x 80 + 2 x 100) - 4 x 100
  // = 40 J (P2P, reductions), is shared by the 4 GPUs: 10 J each.
  EXPECT_DOUBLE_EQ(p.gpu_energy_j(0), 80 + 100 + 10);
  EXPECT_DOUBLE_EQ(p.gpu_energy_j(1), 100 + 100 + 10);
  EXPECT_DOUBLE_EQ(2 * p.gpu_energy_j(0) + 2 * p.gpu_energy_j(1), p.energy_j);
  EXPECT_THROW(p.gpu_energy_j(2), InvalidInput);
  Plan low = p;
  low.energy_j = 700;  // below the parts (a hand edit): no negative share
  EXPECT_DOUBLE_EQ(low.gpu_energy_j(1), 200);

  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "1000000,1200000,1200000,1400000");  // 200 J, 200 J
  MonitorOptions o = fake_options(env, env.dir().file("s.jsonl"));
  o.stage = 0;
  o.prediction = MonitorPrediction::from_plan(p, 0, "hand.json");
  o.tokens_per_iteration = 1000;
  EnergyMonitor m(o);
  one_iteration(m);
  one_iteration(m);
  const MonitorSummary s = m.summary();
  EXPECT_DOUBLE_EQ(*s.energy_per_iteration_j(), 200);
  EXPECT_DOUBLE_EQ(*s.energy_per_token_j(), 0.2);
  const nlohmann::json j = s.to_json();
  EXPECT_EQ(j["prediction"]["source"], "hand.json");
  EXPECT_DOUBLE_EQ(j["prediction"]["iteration_time_s"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(j["prediction"]["energy_per_iteration_j"].get<double>(), 190);
  EXPECT_DOUBLE_EQ(j["prediction"]["avg_power_w"].get<double>(), 95);
  EXPECT_DOUBLE_EQ(j["prediction"]["energy_per_token_j"].get<double>(), 0.19);
  EXPECT_DOUBLE_EQ(j["error"]["energy_per_iteration"].get<double>(), 200.0 / 190 - 1);
  EXPECT_DOUBLE_EQ(j["error"]["energy_per_token"].get<double>(), 0.2 / 0.19 - 1);
  EXPECT_DOUBLE_EQ(j["error"]["iteration_time"].get<double>(), *s.time_per_iteration_s() / 2 - 1);
  EXPECT_DOUBLE_EQ(j["error"]["avg_power"].get<double>(), *s.avg_power_w() / 95 - 1);
  EXPECT_DOUBLE_EQ(j["tokens_per_iteration"].get<double>(), 1000);
}

TEST(Monitor, KilledProcessKeepsEveryFinishedRecord) {
  test::FakeNvmlEnv env;
  env.set("KAREUS_FAKE_NVML_ENERGY_MJ", "0,1000,2000,4000,5000,8000,9000");
  const std::string path = env.dir().file("killed.jsonl");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {  // nothing may unwind into the test framework's copy in this child
      EnergyMonitor m(fake_options(env, path));
      for (int i = 0; i < 3; ++i) {
        m.begin_iteration();
        m.begin_instruction(kF, 0);
        m.end_instruction(kF, 0);
        m.end_iteration();
      }
      m.begin_iteration();  // in flight when the process dies
      raise(SIGKILL);
    } catch (...) {
    }
    _exit(3);
  }
  const auto status = test::wait_child(pid);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  const std::string text = test::read_file(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "whole lines only";
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u) << text;
  const double expected_j[] = {1, 2, 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["record"], "iteration");
    EXPECT_EQ(lines[i]["iteration"], i);
    EXPECT_EQ(lines[i]["instructions"], 1);
    EXPECT_DOUBLE_EQ(lines[i]["energy_j"].get<double>(), expected_j[i]);
  }
  // What the reader makes of it: three iterations, no summary needed.
  const MonitorFile f = read_monitor_file(path);
  EXPECT_EQ(f.iterations.size(), 3u);
  EXPECT_EQ((std::pair{f.rank, f.stage}), (std::pair{3, 1}));
  EXPECT_EQ(f.gpu_uuid, "GPU-fake-0000-0");
}

TEST(Monitor, AForkedChildNeverWritesTheParentsFile) {
  test::TempDir dir;
  MonitorOptions o;
  o.nvml = false;
  o.out_path = dir.file("parent.jsonl");
  EnergyMonitor m(o);
  one_iteration(m);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {  // a data-loader worker's copy: its iteration and its summary stay in memory
      one_iteration(m);
      m.close();
    } catch (...) {
    }
    _exit(0);
  }
  const auto status = test::wait_child(pid);
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  EXPECT_EQ(read_lines(o.out_path).size(), 1u);
  m.close();
  const auto lines = read_lines(o.out_path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["iterations"], 1);
}

}  // namespace
}  // namespace kareus::runtime
