#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/interrupt.h"
#include "kareus/partition.h"
#include "kareus/search_space.h"
#include "kareus/store.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus {
namespace {

// Emulator options by field (ProfilerOptions grows; aggregate initialisation would not).
StoreKey key(int f) { return {"a100-sxm4-40gb", "emulator:x", "sig", "fwd_attn", f, 3, "norm"}; }

TEST(ProfileStore, PutFindRoundTripAndReopen) {
  test::TempDir tmp;
  const std::string db = tmp.file("p.db");
  {
    ProfileStore s(db);
    EXPECT_FALSE(s.find(key(1410)).has_value());
    s.put(key(1410), make_measurement(0.5, 100.0, 85.0));
    s.put(key(1410), make_measurement(9.0, 9.0, 85.0));  // kept, not overwritten
    EXPECT_EQ(s.count_all(), 1u);
  }
  ProfileStore s(db);
  const auto m = s.find(key(1410));
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->time_s, 0.5);
  EXPECT_DOUBLE_EQ(m->static_energy_j, 42.5);
  EXPECT_DOUBLE_EQ(m->dynamic_energy_j, 57.5);
  StoreKey other = key(1410);
  other.backend = "emulator:y";  // another fingerprint is another measurement
  EXPECT_FALSE(s.find(other).has_value());
  EXPECT_EQ(s.count("a100-sxm4-40gb", "emulator:x", "sig"), 1u);
}

TEST(ProfileStore, ForeignAndCorruptFilesAreClearErrors) {
  test::TempDir tmp;
  const std::string text = tmp.write("notes.db", "this is not a database, just text\n");
  try {
    ProfileStore s(text);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("notes.db"), std::string::npos);
  }
  // A real SQLite database of something else.
  const std::string foreign = tmp.file("foreign.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  sqlite3_exec(db, "CREATE TABLE users(id INTEGER)", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  try {
    ProfileStore s(foreign);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("not a Kareus profile store"), std::string::npos);
  }
  // A Kareus store whose pages were overwritten.
  const std::string good = tmp.file("good.db");
  {
    ProfileStore s(good);
    for (int f = 900; f <= 1410; f += 15) s.put(key(f), make_measurement(0.1, 10, 85));
  }
  std::filesystem::remove(good + "-wal");
  std::filesystem::remove(good + "-shm");
  {
    std::fstream f(good, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("garbage garbage garbage garbage ", 32);  // clobbers the header
  }
  EXPECT_THROW(ProfileStore s(good), InvalidInput);
  // The CLI turns all of this into exit code 2 with the path in the message.
  const auto r = test::run_cli("profile " + test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096") +
                               " --sweep --db " + text);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("notes.db"), std::string::npos);
}

TEST(CachedProfiler, MeasuresOnlyMissingPoints) {
  test::TempDir tmp;
  const auto w = load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096"));
  const auto ps = partition_workload(w);
  const auto& p = ps.partition("bwd_mlp");
  EmulatorProfiler prof(test::emulator_options(w.gpu_name, 0.01, 3));
  ProfileStore store(tmp.file("s.db"));
  CachedProfiler a(prof, &store);
  const auto first = a.measure(p, {1200, 6, "linear"});
  EXPECT_EQ(a.measured(), 1);
  CachedProfiler b(prof, &store);
  const auto again = b.measure(p, {1200, 6, "linear"});
  EXPECT_EQ(b.measured(), 0);
  EXPECT_EQ(b.reused(), 1);
  EXPECT_DOUBLE_EQ(again.energy_j, first.energy_j);
}

// A stop request (SIGINT/SIGTERM through the CLI's handler) ends the run before the next new
// measurement: nothing is measured or written after it, while stored and served points are
// still returned.
TEST(CachedProfiler, InterruptStopsBeforeTheNextMeasurement) {
  test::TempDir tmp;
  const auto w = load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096"));
  const auto ps = partition_workload(w);
  const auto& p = ps.partition("bwd_mlp");
  EmulatorProfiler prof(test::emulator_options(w.gpu_name, 0.01, 3));
  ProfileStore store(tmp.file("s.db"));
  CachedProfiler c(prof, &store);
  const auto first = c.measure(p, {1200, 6, "linear"});
  request_interrupt(SIGINT);
  request_interrupt(SIGTERM);  // the first signal is kept
  EXPECT_EQ(interrupt_requested(), SIGINT);
  try {
    c.measure(p, {1200, 8, "linear"});
    ADD_FAILURE() << "measured after a stop request";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_STREQ(e.what(), "interrupted (SIGINT)");
  }
  EXPECT_THROW(c.measure_batch(p, {{1200, 6, "linear"}, {1210, 6, "linear"}}), Interrupted);
  EXPECT_DOUBLE_EQ(c.measure(p, {1200, 6, "linear"}).energy_j, first.energy_j);  // memo
  EXPECT_EQ(c.measured(), 1);
  EXPECT_EQ(store.count_all(), 1u);
  CachedProfiler fresh(prof, &store);  // from the store, so no measurement: allowed
  EXPECT_DOUBLE_EQ(fresh.measure(p, {1200, 6, "linear"}).energy_j, first.energy_j);
  clear_interrupt();
  EXPECT_EQ(interrupt_requested(), 0);
  c.measure(p, {1200, 8, "linear"});
  EXPECT_EQ(store.count_all(), 2u);
}

// A measurement during which a stop request arrives is dropped: the signal may have disturbed
// it (the NVML clock guard resets locked clocks on a signal).
TEST(CachedProfiler, PointMeasuredWhileAStopArrivedIsNotStored) {
  struct StopsWhileMeasuring : EmulatorProfiler {
    using EmulatorProfiler::EmulatorProfiler;
    Measurement measure(const Partition& p, const PartitionConfig& c) override {
      const Measurement m = EmulatorProfiler::measure(p, c);
      request_interrupt(SIGTERM);  // as the handler would, mid-measurement
      return m;
    }
  };
  test::TempDir tmp;
  const auto w = load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096"));
  const auto ps = partition_workload(w);
  StopsWhileMeasuring prof(test::emulator_options(w.gpu_name, 0.01, 3));
  ProfileStore store(tmp.file("s.db"));
  CachedProfiler c(prof, &store);
  EXPECT_THROW(c.measure(ps.partition("bwd_mlp"), {1200, 6, "linear"}), Interrupted);
  clear_interrupt();
  EXPECT_EQ(store.count_all(), 0u);
  EXPECT_EQ(c.measured(), 0);
  EXPECT_FALSE(c.stored(ps.partition("bwd_mlp"), {1200, 6, "linear"}));
}

// Issue 3's crash test: SIGKILL a sweep mid-run, restart it, and check that the store ends with
// every configuration exactly once and that the restart measured only the missing ones.
TEST(ProfileStore, SweepSurvivesSigkill) {
  test::TempDir tmp;
  const std::string db = tmp.file("sweep.db");
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto w = load_workload(wl);
  const auto ps = partition_workload(w);
  const std::size_t configs = make_search_space(ps.partition("fwd_mlp"), w.gpu()).size();
  ASSERT_EQ(configs, 540u);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl(KAREUS_CLI, KAREUS_CLI, "profile", wl.c_str(), "--sweep", "--partition", "fwd_mlp",
          "--db", db.c_str(), "--emulate-profiling-delay-ms", "4", "--quiet",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  auto rows = [&] {
    sqlite3* h = nullptr;
    if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
      sqlite3_close(h);
      return -1;
    }
    sqlite3_busy_timeout(h, 5000);
    sqlite3_stmt* s = nullptr;
    int n = -1;
    if (sqlite3_prepare_v2(h, "SELECT COUNT(*) FROM measurements", -1, &s, nullptr) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW) {
      n = sqlite3_column_int(s, 0);
    }
    sqlite3_finalize(s);
    sqlite3_close(h);
    return n;
  };
  // Kill once a fair share, but not all, of the points are in.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (rows() < 100 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the sweep finished before it could be killed";
  const int before = rows();
  ASSERT_GE(before, 100);
  ASSERT_LT(before, 540);

  const auto r = test::run_cli("profile " + wl + " --sweep --partition fwd_mlp --db " + db +
                               " --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("reused").get<int>(), before);
  EXPECT_EQ(j.at("measured").get<int>(), 540 - before);
  EXPECT_EQ(rows(), 540);
  // Exactly once: no two rows share a configuration.
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h,
                               "SELECT COUNT(*) FROM (SELECT DISTINCT freq_mhz, sms, slot FROM "
                               "measurements WHERE label='fwd_mlp')",
                               -1, &s, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), 540);
  sqlite3_finalize(s);
  sqlite3_close(h);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// Several processes creating one new store at the same moment (as `eval --jobs` does): every
// one of them must succeed and every point must be stored.
TEST(ProfileStore, ConcurrentFirstUseFromSeveralProcesses) {
  test::TempDir tmp;
  const std::string db = tmp.file("fresh.db");
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  constexpr int kProcesses = 6;
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      const std::string freq = std::to_string(1410 - 30 * i);
      execl(KAREUS_CLI, KAREUS_CLI, "profile", wl.c_str(), "--partition", "fwd_mlp", "--freq",
            freq.c_str(), "--sms", "6", "--slot", "linear", "--db", db.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a process failed on a fresh store, status " << status;
  }
  ProfileStore store(db);
  EXPECT_EQ(store.count_all(), static_cast<std::size_t>(kProcesses));
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// The shapes table: written by CachedProfiler when it first measures a partition, read back by
// shape() and joined with the measurements by related(), which leaves out other kinds, other
// GPUs and the excluded signature.
TEST(ProfileStore, PartitionShapesRoundTripAndRelated) {
  test::TempDir tmp;
  const std::string db = tmp.file("shapes.db");
  const Workload w8 = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const Workload w16 = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs16_seq4096"));
  const Partition a = partition_workload(w8).partition("fwd_mlp");
  const Partition b = partition_workload(w16).partition("fwd_mlp");
  const Partition other = partition_workload(w8).partition("fwd_attn");
  EmulatorProfiler prof(test::emulator_options(w8.gpu_name, 0.0, 1));
  const auto configs = make_search_space(a, prof.gpu()).configs();
  {
    ProfileStore s(db);
    CachedProfiler cp(prof, &s);
    cp.measure_batch(a, {configs[0], configs[1]});
    cp.measure(b, configs[2]);
    cp.measure(other, make_search_space(other, prof.gpu()).configs()[0]);
  }
  ProfileStore s(db);  // reopened: the table persists
  const auto sa = s.shape(a.signature);
  ASSERT_TRUE(sa.has_value());
  EXPECT_EQ(sa->key, "fwd_mlp");
  EXPECT_DOUBLE_EQ(sa->compute_flops, a.compute_flops());
  double bytes = 0;
  for (const auto& k : a.compute_ops) bytes += k.bytes_read + k.bytes_written;
  EXPECT_DOUBLE_EQ(sa->compute_bytes, bytes);
  EXPECT_DOUBLE_EQ(sa->collective_bytes, a.collective.payload_bytes);
  EXPECT_EQ(sa->group_size, a.collective.group_size);
  EXPECT_EQ(sa->slots, a.slot_names());
  EXPECT_FALSE(s.shape("no-such-signature").has_value());
  // b's fwd_mlp is twice the micro-batch: twice the FLOPs.
  EXPECT_NEAR(s.shape(b.signature)->compute_flops / sa->compute_flops, 2.0, 1e-9);
  const auto rel = s.related(prof.gpu().name, "fwd_mlp", b.signature);
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_EQ(rel[0].shape.signature, a.signature);
  EXPECT_EQ(rel[0].backend, prof.fingerprint());
  ASSERT_EQ(rel[0].points.size(), 2u);
  const auto m0 = prof.measure(a, configs[0]);
  bool found = false;
  for (const auto& [c, m] : rel[0].points) {
    if (c.freq_mhz == configs[0].freq_mhz && c.sms == configs[0].sms && c.slot == configs[0].slot) {
      found = true;
      EXPECT_DOUBLE_EQ(m.time_s, m0.time_s);
      EXPECT_DOUBLE_EQ(m.energy_j, m0.energy_j);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(s.related(prof.gpu().name, "fwd_mlp", "none").size(), 2u);
  EXPECT_TRUE(s.related("h100-sxm", "fwd_mlp", "none").empty());
  EXPECT_EQ(s.related(prof.gpu().name, "fwd_attn", "none").size(), 1u);
  // A snapshot before anything was measured holds nothing (the CLI's warm start reads the
  // store as it was when the run began).
  EXPECT_TRUE(s.related(prof.gpu().name, "fwd_mlp", "none", 1.0).empty());
}

}  // namespace
}  // namespace kareus
