// Measured against emulated frontiers (fidelity.h): the comparison on hand-made frontiers, and
// `kareus calibrate --artifact-csv` on one workload against the committed CSV and against what
// `kareus eval` plans for the same workload.
#include "kareus/fidelity.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "kareus/error.h"
#include "test_util.h"

namespace kareus {
namespace {

TEST(Fidelity, ComparesFiguresInTheArtifactsConvention) {
  // Measured: Perseus fastest 5 s / 2000 J, least 1800 J; Nanobatching+Perseus faster (4.5 s).
  const std::vector<ArtifactFrontier> measured = {
      {"llama3.2-3b_tp8_mbs8_seq4096", "perseus", {{5.0, 2000.0}, {6.0, 1800.0}}},
      {"llama3.2-3b_tp8_mbs8_seq4096", "nanobatch_perseus", {{4.5, 1900.0}}}};
  // Emulated, whole job on 8 GPUs per stage: Perseus 5.5 s / 8 x 2100 J, least 8 x 1710 J;
  // Nanobatching+Perseus slower than Perseus (5.6 s): the sign does not match.
  EmulatedWorkload e;
  e.gpus_per_stage = 8;
  e.evaluation.perseus = {{5.5, 8 * 2100.0, "perseus"}, {7.0, 8 * 1710.0, "perseus"}};
  e.evaluation.nanobatch_perseus = {{5.6, 8 * 1995.0, "nanobatch_perseus"}};
  const FidelityReport r = artifact_fidelity(measured, {{"llama3.2-3b_tp8_mbs8_seq4096", e}});
  ASSERT_EQ(r.rows.size(), 2u);
  const FidelityRow& p = r.rows[0];
  EXPECT_EQ(p.set, "fit");
  EXPECT_DOUBLE_EQ(p.measured.fastest_time_s, 5.0);
  EXPECT_DOUBLE_EQ(p.emulated.fastest_energy_j, 2100.0);
  EXPECT_NEAR(p.fastest_time_error, 0.10, 1e-12);
  EXPECT_NEAR(p.fastest_energy_error, 0.05, 1e-12);
  EXPECT_NEAR(p.least_energy_error, -0.05, 1e-12);
  EXPECT_NEAR(r.rows[1].fastest_time_error, 5.6 / 4.5 - 1, 1e-12);
  EXPECT_NEAR(r.worst_fit_error, 5.6 / 4.5 - 1, 1e-12);
  EXPECT_EQ(r.worst_held_out_error, 0);
  ASSERT_EQ(r.signs.size(), 1u);
  EXPECT_NEAR(r.signs[0].measured, -0.1, 1e-12);
  EXPECT_FALSE(r.signs[0].match);
  EXPECT_EQ(r.sign_matches, 0);
  EXPECT_EQ(emulated_method_name("nanobatch_perseus"), "Nanobatching+Perseus");
  EXPECT_THROW(artifact_fidelity(measured, {}), InvalidInput);
}

// One workload of the committed CSV: the measured figures are the CSV's, and the emulated
// fastest Perseus time is the one `kareus eval --noise 0` reports for that workload.
TEST(Fidelity, CalibrateArtifactCsvMatchesCsvAndEval) {
  const std::string name = "qwen3-1.7b_tp8_mbs8_seq4096";
  const std::string csv = test::source_path("data/calibration/artifact_frontiers.csv");
  const auto r =
      test::run_cli("calibrate --artifact-csv " + csv + " --only " + name + " --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("rows").size(), 2u);  // perseus, nanobatch_perseus
  std::map<std::string, ArtifactFrontier> by_method;
  for (const auto& f : read_artifact_csv(csv)) {
    if (f.workload == name) by_method[f.method] = f;
  }
  for (const auto& row : j.at("rows")) {
    EXPECT_EQ(row.at("workload"), name);
    EXPECT_EQ(row.at("set"), "fit");
    const ArtifactFrontier& f = by_method.at(row.at("method").get<std::string>());
    double least = f.points.front().energy_j;
    for (const auto& p : f.points) least = std::min(least, p.energy_j);
    EXPECT_EQ(row.at("measured").at("fastest_time_s").get<double>(), f.points.front().time_s);
    EXPECT_EQ(row.at("measured").at("fastest_energy_j").get<double>(), f.points.front().energy_j);
    EXPECT_EQ(row.at("measured").at("least_energy_j").get<double>(), least);
  }
  ASSERT_EQ(j.at("signs").size(), 1u);

  test::TempDir suite;
  std::filesystem::copy_file(test::paper_workload(name), suite.file(name + ".yaml"));
  const auto e = test::run_cli("eval --suite " + suite.path() + " --noise 0 --json --quiet");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const auto ej = nlohmann::json::parse(e.out);
  const double eval_fastest =
      ej.at(0).at("operating_points").at("perseus_fastest").at("iteration_time_s").get<double>();
  const double ours = j.at("rows").at(0).at("emulated").at("fastest_time_s").get<double>();
  EXPECT_EQ(j.at("rows").at(0).at("method"), "perseus");
  EXPECT_NEAR(ours / eval_fastest - 1, 0, 1e-9);
}

TEST(Fidelity, CalibrateArtifactRefusesUnknownWorkloadAndMixedFlags) {
  const std::string csv = test::source_path("data/calibration/artifact_frontiers.csv");
  const auto r = test::run_cli("calibrate --artifact-csv " + csv + " --only nope --quiet");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--only nope"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_cli("calibrate --artifact-csv " + csv + " --no-fit").exit_code, 2);
  EXPECT_EQ(test::run_cli("calibrate --only " + std::string("x")).exit_code, 2);
}

}  // namespace
}  // namespace kareus
