// The reader of the Kareus artifact's frontier files (artifact.h) on small fixture trees, its
// errors, and the committed extraction (data/calibration/artifact_frontiers.csv) against the
// calibration anchor that was read from the same files by hand.
#include "kareus/artifact.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "kareus/error.h"
#include "test_util.h"

namespace kareus {
namespace {

// One frontier file as the artifact writes it: the plan, then the solver's comment lines.
std::string frontier_file(const std::string& iteration, const std::string& total,
                          const std::string& with_p2p) {
  return "[\n[('forward', 1410), ('backward', 1410)],\n]\n# Iteration " + iteration +
         " cost change: 0.01\n# Iteration " + iteration + " total cost: " + total +
         "\n# Iteration " + iteration + " total cost with P2P: " + with_p2p + "\n";
}

void write_tree_file(const test::TempDir& dir, const std::string& rel, const std::string& text) {
  const std::filesystem::path p = std::filesystem::path(dir.path()) / rel;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidInput";
  return "";
}

TEST(Artifact, PointIsBlockingTimeAndEnergyWithP2p) {
  // Hand computed: time = (1850 - 1000) / (2 x 85 W) = 5 s; energy = 1850 J.
  const ArtifactPoint p = parse_artifact_point(frontier_file("7", "1000", "1850"), "f.py");
  EXPECT_DOUBLE_EQ(p.time_s, 5.0);
  EXPECT_DOUBLE_EQ(p.energy_j, 1850.0);
}

TEST(Artifact, FastestPerseusPointEqualsTheCalibrationAnchor) {
  // The two lines of tests/perseus/schedules/megatron_llama3.2_3b/cp1_tp8_mbs8_seq4096/frontier/
  // freqs_pipeline_01900.py (artifact commit 98f02558): the first perseus row of
  // data/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv, 5.113 s and 2814.2 J.
  const ArtifactPoint p =
      parse_artifact_point(frontier_file("1900", "1945.0292962136812", "2814.239296213681"), "f");
  EXPECT_NEAR(p.time_s, 5.113, 5e-4);
  EXPECT_NEAR(p.energy_j, 2814.2, 0.05);
}

TEST(Artifact, ReadsACheckoutTree) {
  test::TempDir dir;
  const std::string perseus = "tests/perseus/schedules/megatron_llama3.2_3b/cp2_tp4_mbs8_seq4096";
  write_tree_file(dir, perseus + "/frontier/freqs_pipeline_00002.py",
                  frontier_file("2", "1000", "2020"));  // 6 s, 2020 J
  write_tree_file(dir, perseus + "/frontier/freqs_pipeline_00001.py",
                  frontier_file("1", "1200", "2050"));  // 5 s, 2050 J
  write_tree_file(dir, perseus + "/frontier/notes.txt", "not a frontier point");
  write_tree_file(dir, perseus + "/freqs_pipeline_00009.py", "outside frontier/: ignored");
  write_tree_file(dir,
                  "tests/kareus/schedules/megatron_qwen3_1.7b/cp1_tp8_mbs16_seq4096/frontier/"
                  "scheds_pipeline_00003.py",
                  frontier_file("3", "500", "1180"));  // 4 s, 1180 J
  // Kareus ships the clocks and the schedule of a point, with the same cost lines: one point.
  write_tree_file(dir,
                  "tests/kareus/schedules/megatron_qwen3_1.7b/cp1_tp8_mbs16_seq4096/frontier/"
                  "freqs_pipeline_00003.py",
                  frontier_file("3", "500", "1180"));
  write_tree_file(dir,
                  "tests/nanobatch_perseus/schedules/megatron_llama3.2_3b/cp2_tp4_mbs8_seq4096/"
                  "frontier/freqs_pipeline_00004.py",
                  frontier_file("4", "100", "950"));  // 5 s, 950 J
  for (const std::string& root : {dir.path(), dir.file("tests")}) {
    const auto f = read_artifact_frontiers(root);
    ASSERT_EQ(f.size(), 3u) << root;
    EXPECT_EQ(f[0].workload, "llama3.2-3b_cp2tp4_mbs8_seq4096");
    EXPECT_EQ(f[0].method, "perseus");
    ASSERT_EQ(f[0].points.size(), 2u);
    EXPECT_DOUBLE_EQ(f[0].points[0].time_s, 5.0);  // fastest first
    EXPECT_DOUBLE_EQ(f[0].points[0].energy_j, 2050.0);
    EXPECT_DOUBLE_EQ(f[0].points[1].time_s, 6.0);
    EXPECT_DOUBLE_EQ(f[0].points[1].energy_j, 2020.0);
    EXPECT_EQ(f[1].workload, "llama3.2-3b_cp2tp4_mbs8_seq4096");
    EXPECT_EQ(f[1].method, "nanobatch_perseus");
    EXPECT_EQ(f[2].workload, "qwen3-1.7b_tp8_mbs16_seq4096");
    EXPECT_EQ(f[2].method, "kareus");
    ASSERT_EQ(f[2].points.size(), 1u);
    EXPECT_DOUBLE_EQ(f[2].points[0].time_s, 4.0);
    EXPECT_DOUBLE_EQ(f[2].points[0].energy_j, 1180.0);
  }
}

TEST(Artifact, MalformedOrMissingLineNamesFileAndLine) {
  test::TempDir dir;
  const std::string rel =
      "tests/perseus/schedules/megatron_llama3.2_3b/cp1_tp8_mbs8_seq4096/frontier/"
      "freqs_pipeline_00001.py";
  // Line 5 of the file: "# Iteration 1 total cost: 12x".
  write_tree_file(dir, rel, frontier_file("1", "12x", "20"));
  const std::string bad = message_of([&] { read_artifact_frontiers(dir.path()); });
  EXPECT_NE(bad.find(dir.file(rel) + ":5:"), std::string::npos) << bad;
  EXPECT_NE(bad.find("total cost"), std::string::npos) << bad;

  const std::string missing = message_of(
      [] { parse_artifact_point("# Iteration 1 total cost: 10\n", "dir/freqs_pipeline_1.py"); });
  EXPECT_NE(missing.find("dir/freqs_pipeline_1.py"), std::string::npos) << missing;
  EXPECT_NE(missing.find("total cost with P2P"), std::string::npos) << missing;

  const std::string garbled =
      message_of([] { parse_artifact_point("x\n# Iteration 1 total cost 10\n", "g.py"); });
  EXPECT_NE(garbled.find("g.py:2:"), std::string::npos) << garbled;

  test::TempDir empty;
  EXPECT_THROW(read_artifact_frontiers(empty.path()), InvalidInput);
}

TEST(Artifact, WorkloadNamesAndTheSplit) {
  EXPECT_EQ(artifact_workload_name("megatron_llama3.2_3b", "cp1_tp8_mbs8_seq4096"),
            "llama3.2-3b_tp8_mbs8_seq4096");
  EXPECT_EQ(artifact_workload_name("megatron_qwen3_1.7b", "cp2_tp4_mbs16_seq4096"),
            "qwen3-1.7b_cp2tp4_mbs16_seq4096");
  EXPECT_THROW(artifact_workload_name("llama", "cp1_tp8_mbs8_seq4096"), InvalidInput);
  EXPECT_THROW(artifact_workload_name("megatron_llama3.2_3b", "tp8"), InvalidInput);
  EXPECT_EQ(artifact_set("llama3.2-3b_tp8_mbs8_seq4096"), "fit");
  EXPECT_EQ(artifact_set("qwen3-1.7b_tp8_mbs8_seq8192"), "held-out");
}

TEST(Artifact, CsvRoundTripsAndRefusesABadRow) {
  const std::vector<ArtifactFrontier> f = {{"w", "perseus", {{5.0, 2000.0}, {6.25, 1900.5}}}};
  std::ostringstream out;
  write_artifact_csv(out, f, {"source: test", ""});
  test::TempDir dir;
  const std::string path = dir.write("a.csv", out.str());
  const auto back = read_artifact_csv(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].workload, "w");
  ASSERT_EQ(back[0].points.size(), 2u);
  EXPECT_DOUBLE_EQ(back[0].points[1].time_s, 6.25);
  EXPECT_DOUBLE_EQ(back[0].points[1].energy_j, 1900.5);
  const std::string bad = dir.write("b.csv",
                                    "# c\nworkload,method,iter_time_s,energy_j\n"
                                    "w,perseus,5,2000\nw,perseus,five,2000\n");
  const std::string msg = message_of([&] { read_artifact_csv(bad); });
  EXPECT_NE(msg.find(bad + ":4:"), std::string::npos) << msg;
}

// The committed extraction holds 10 workloads x (perseus, nanobatch_perseus) plus Kareus on one,
// five of them in the fit set, and for the anchor workload exactly the rows of the calibration
// anchor (which states 3 decimals of time and 1 of energy).
TEST(Artifact, CommittedCsvAgreesWithTheCalibrationAnchor) {
  const auto f = read_artifact_csv(test::source_path("data/calibration/artifact_frontiers.csv"));
  ASSERT_EQ(f.size(), 21u);
  std::set<std::string> workloads, fit;
  for (const auto& x : f) {
    workloads.insert(x.workload);
    if (artifact_set(x.workload) == "fit") fit.insert(x.workload);
    EXPECT_TRUE(std::filesystem::exists(test::paper_workload(x.workload))) << x.workload;
  }
  EXPECT_EQ(workloads.size(), 10u);
  EXPECT_EQ(fit.size(), 5u);
  std::map<std::string, std::vector<ArtifactPoint>> anchor;
  std::ifstream in(
      test::source_path("data/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.rfind("method,", 0) == 0) continue;
    std::stringstream ss(line);
    std::string method, t, e;
    std::getline(ss, method, ',');
    std::getline(ss, t, ',');
    std::getline(ss, e, ',');
    anchor[method].push_back({std::stod(t), std::stod(e)});
  }
  ASSERT_EQ(anchor.size(), 2u);
  for (const auto& x : f) {
    if (x.workload != "llama3.2-3b_tp8_mbs8_seq4096" || !anchor.count(x.method)) continue;
    const auto& a = anchor.at(x.method);
    ASSERT_EQ(x.points.size(), a.size()) << x.method;
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(x.points[i].time_s, a[i].time_s, 5e-4) << x.method << " row " << i;
      EXPECT_NEAR(x.points[i].energy_j, a[i].energy_j, 0.05) << x.method << " row " << i;
    }
    anchor.erase(x.method);
  }
  EXPECT_TRUE(anchor.empty()) << "anchor methods missing from the extraction";
}

}  // namespace
}  // namespace kareus
