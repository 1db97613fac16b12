// Ask/tell profiling: the search asks for whole batches of points a trace lacks, and a loop of
// "measure the batch elsewhere, append it to the trace, rerun" ends with exactly the result of a
// direct run with the same seeds.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/search.h"
#include "test_util.h"

namespace kareus {
namespace {

// Emulator options by field (ProfilerOptions grows; aggregate initialisation would not).
std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ls(line);
    std::string c;
    while (std::getline(ls, c, ',')) cols.push_back(c);
    rows.push_back(cols);
  }
  return rows;
}

TEST(AskTell, BatchWithMissingPointsThrowsTheWholeBatch) {
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const PartitionSet ps = partition_workload(w);
  const Partition& p = ps.partition("fwd_mlp");
  test::TempDir tmp;
  const std::string trace = tmp.write("t.csv",
                                      "partition,freq_mhz,sms,slot,time_s,energy_j\n"
                                      "fwd_mlp,1410,24,norm,0.01,3.5\n");
  ProfilerOptions o;
  o.gpu = w.gpu_name;
  o.trace_path = trace;
  auto backend = create_profiler("trace", o);
  const std::vector<PartitionConfig> batch = {
      {1380, 24, "norm"}, {1410, 24, "norm"}, {1410, 3, "linear"}};
  EXPECT_FALSE(backend->can_measure(p, batch[0]));
  EXPECT_TRUE(backend->can_measure(p, batch[1]));
  {
    CachedProfiler cp(*backend, nullptr);
    EXPECT_THROW(cp.measure_batch(p, batch), InvalidInput);  // without ask mode: the trace's error
  }
  CachedProfiler cp(*backend, nullptr);
  cp.set_ask_mode(true);
  std::vector<std::size_t> served;
  try {
    cp.measure_batch(p, batch, [&](std::size_t i, const Measurement&) { served.push_back(i); });
    ADD_FAILURE() << "no MeasurementsNeeded";
  } catch (const MeasurementsNeeded& e) {
    EXPECT_EQ(e.partition(), "fwd_mlp");
    EXPECT_EQ(e.configs(), (std::vector<PartitionConfig>{batch[0], batch[2]}));
  }
  EXPECT_EQ(served, (std::vector<std::size_t>{1}));  // the point it has is served first
  const auto ms = cp.measure_batch(p, {batch[1]});
  EXPECT_DOUBLE_EQ(ms.at(0).energy_j, 3.5);
  EXPECT_DOUBLE_EQ(ms.at(0).static_energy_j, 0.01 * w.gpu().static_power_w);
}

TEST(AskTell, StrategiesMeasureInBatches) {
  // The emulator behind a counting backend: MBO's calls come as the initial design and then one
  // call per batch, so ask mode can ask for each of them whole.
  const Workload w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const PartitionSet ps = partition_workload(w);
  const Partition& p = ps.partition("bwd_mlp");
  EmulatorProfiler emu(test::emulator_options(w.gpu_name, 0.01, 3));
  CachedProfiler cp(emu, nullptr);
  const auto space = make_search_space(p, w.gpu());
  SearchOptions o;
  o.budget = 64;
  o.seed = 4;
  std::vector<int> done;
  const auto r =
      create_search_strategy("mbo")->run(p, space, cp, o, [&](int d, int) { done.push_back(d); });
  ASSERT_EQ(r.evaluations, 64);
  // 21 initial points, then batches of 7 (the default schedule does not depend on the
  // budget): 21 + 6 x 7 + 1.
  EXPECT_EQ(r.batches, 7);
  EXPECT_EQ(done.size(), 64u);
}

TEST(AskTell, LoopThroughTheCliReachesTheDirectFront) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  test::TempDir tmp;
  const std::string measured = tmp.file("measured.csv"), next = tmp.file("next.csv");
  const std::string search = "search " + wl + " --partition fwd_mlp --budget 64 --seed 7 --json";
  const std::string ask = search + " --backend trace --trace " + measured + " --ask " + next;
  int rounds = 0;
  test::CommandResult r;
  std::set<std::string> asked;
  for (; rounds < 12; ++rounds) {
    r = test::run_cli(ask);
    if (r.exit_code != 3) break;
    const auto rows = csv_rows(test::read_file(next));
    ASSERT_GE(rows.size(), 2u) << "round " << rounds;
    EXPECT_EQ(rows[0], (std::vector<std::string>{"partition", "freq_mhz", "sms", "slot"}));
    for (std::size_t i = 1; i < rows.size(); ++i) {
      ASSERT_EQ(rows[i].size(), 4u);
      EXPECT_EQ(rows[i][0], "fwd_mlp");
      const int f = std::stoi(rows[i][1]), sms = std::stoi(rows[i][2]);
      EXPECT_TRUE(f >= 900 && f <= 1410 && (1410 - f) % 30 == 0) << f;
      EXPECT_TRUE(sms >= 3 && sms <= 30 && sms % 3 == 0) << sms;
      EXPECT_TRUE(rows[i][3] == "norm" || rows[i][3] == "linear" || rows[i][3] == "activation")
          << rows[i][3];
      // A point is asked for once: the next run finds it in the trace.
      EXPECT_TRUE(asked.insert(rows[i][1] + "," + rows[i][2] + "," + rows[i][3]).second);
    }
    if (rounds == 0) {
      // A trace gets the emulator prior (--prior auto): half the initial design first, the
      // other half once the prior has been checked against it.
      EXPECT_EQ(rows.size() - 1, 10u);  // 21 / 2
      EXPECT_NE(r.err.find("needed"), std::string::npos) << r.err;
    }
    const auto m = test::run_cli("profile " + wl + " --backend emulator --noise-seed 11 --points " +
                                 next + " --append " + measured + " --quiet");
    ASSERT_EQ(m.exit_code, 0) << m.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(rounds, 9);  // initial design in two halves + 7 batches (6 x 7 + 1)
  EXPECT_EQ(asked.size(), 64u);
  EXPECT_EQ(csv_rows(test::read_file(next)).size(), 1u);  // header only: nothing left to ask

  // A trace gets the emulator prior by default (--prior auto); the direct run asks for it.
  const auto direct =
      test::run_cli(search + " --backend emulator --noise-seed 11 --prior emulator --quiet");
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  const auto a = nlohmann::json::parse(r.out), b = nlohmann::json::parse(direct.out);
  for (const char* list : {"front", "points"}) {
    ASSERT_EQ(a.at(list).size(), b.at(list).size()) << list;
    for (std::size_t i = 0; i < a.at(list).size(); ++i) {
      for (const char* k : {"freq_mhz", "sms", "slot", "time_s", "energy_j", "dynamic_energy_j"}) {
        EXPECT_EQ(a.at(list)[i].at(k), b.at(list)[i].at(k)) << list << " " << i << " " << k;
      }
    }
  }
  EXPECT_EQ(a.at("batches"), b.at("batches"));
}

TEST(AskTell, BadPointsFilesAreClearErrors) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  test::TempDir tmp;
  struct Bad {
    std::string text, needle;
  };
  for (const auto& b : std::vector<Bad>{
           {"partition,freq,sms,slot\n", "header must start with"},
           {"partition,freq_mhz,sms,slot\nfwd_mlp,1410,x,norm\n", "must be integers"},
           {"partition,freq_mhz,sms,slot\nffn,1410,24,norm\n", "neither a partition"},
           {"partition,freq_mhz,sms,slot\nfwd_mlp,1405,24,norm\n", "210..1410"},
           {"partition,freq_mhz,sms,slot\nembedding,1410,3,norm\n", "sms 0 and slot '-'"}}) {
    const auto pts = tmp.write("p.csv", b.text);
    const auto r = test::run_cli("profile " + wl + " --points " + pts);
    EXPECT_EQ(r.exit_code, 2) << b.text;
    EXPECT_NE(r.err.find(b.needle), std::string::npos) << b.text << ": " << r.err;
  }
  // Segments by trace name, printed as trace rows when nothing is appended.
  const auto pts =
      tmp.write("s.csv", "partition,freq_mhz,sms,slot\nembedding@0/forward,1410,0,-\n");
  const auto r = test::run_cli("profile " + wl + " --points " + pts);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = csv_rows(r.out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].size(), 6u);
  EXPECT_EQ(rows[1][0], "embedding@0/forward");
  EXPECT_GT(std::stod(rows[1][4]), 0);
  // A trace with another header is not appended to.
  const auto other = tmp.write("o.csv", "a,b\n");
  const auto ok = tmp.write("k.csv", "partition,freq_mhz,sms,slot\nfwd_mlp,1410,24,norm\n");
  const auto bad = test::run_cli("profile " + wl + " --points " + ok + " --append " + other);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--append"), std::string::npos) << bad.err;
}

TEST(AskTell, WorkloadShowListsTraceNamesOfSegments) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto r = test::run_cli("workload show " + wl + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> names;
  for (const auto& s : j.at("segments")) {
    const std::string expect = s.at("name").get<std::string>() + "@" +
                               std::to_string(s.at("stage").get<int>()) + "/" +
                               s.at("instruction").get<std::string>();
    EXPECT_EQ(s.at("trace_name"), expect);
    names.insert(expect);
  }
  EXPECT_EQ(names.size(), j.at("segments").size());  // trace names are unique
  EXPECT_TRUE(names.count("embedding@0/forward"));
  const auto t = test::run_cli("workload show " + wl);
  EXPECT_NE(t.out.find("embedding@0/forward"), std::string::npos);
}

TEST(AskTell, HelpDocumentsExitCode3) {
  const auto r = test::run_cli("search --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("3 measurements needed"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kareus
