// The zoo of real job shapes (workloads/zoo: sequence parallelism at TP 2-8, PP 1-16, DP, CP
// with SP, micro-batches 1-8, sequences 2k-128k, A100/A40/H100/H200, 8 to 16,384 GPUs), each
// evaluated against the baselines through the CLI. Two guarantees are checked on every one,
// from the evaluation's JSON and independently of src/eval:
//  - Kareus's own frontier (no fallback to a baseline's plans) needs at most 0.5% more energy
//    than Perseus or Nanobatching+Perseus at any deadline both meet;
//  - every method's fastest point is at most 0.1% slower than running that method at the
//    maximum clock (Perseus against Megatron-LM; Nanobatching+Perseus and Kareus against
//    Nanobatching).
// The per-workload table it prints is the one in docs/benchmarks.md; KAREUS_ZOO_TABLE=PATH
// (KAREUS_MOE_TABLE=PATH for the mixtures of experts in workloads/moe) writes it as Markdown.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "own_frontier_check.h"
#include "test_util.h"

namespace kareus {
namespace {

constexpr double kMaxLossPct = 0.5;
constexpr double kMaxFastEndPct = 0.1;

double fastest_s(const nlohmann::json& points) {
  double t = 1e300;
  for (const auto& p : points) t = std::min(t, p.at("iteration_time_s").get<double>());
  return t;
}

double pct_over(double value, double reference) { return 100.0 * (value / reference - 1.0); }

// Evaluates every workload of `folder` and checks both guarantees; returns the table.
std::string check_suite(const std::string& folder, std::size_t min_workloads) {
  test::TempDir tmp;
  const auto r = test::run_cli("eval --suite " + test::source_path(folder) +
                               " --jobs 2 --quiet --json --out " + tmp.file("zoo.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return "";
  const auto evals = nlohmann::json::parse(test::read_file(tmp.file("zoo.json")));
  EXPECT_GE(evals.size(), min_workloads);
  std::string table =
      "| workload | GPUs | iso-time saving | iso-energy saving | max-throughput time | worst "
      "loss vs Perseus | worst loss vs NB+Perseus | fastest: Perseus / Megatron | NB+P / NB | "
      "Kareus / NB |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& w : evals) {
    const std::string name = w.at("workload");
    const auto& own = w.at("kareus_without_fallback");
    const test::OwnLoss lp = test::own_loss(own, w.at("perseus"));
    const test::OwnLoss ln = test::own_loss(own, w.at("nanobatch_perseus"));
    EXPECT_LE(lp.worst_excess_pct, kMaxLossPct)
        << name << ": Kareus's own frontier loses to Perseus at " << lp.lost << " of "
        << lp.deadlines << " deadlines (" << lp.from_s << ".." << lp.to_s << " s)";
    EXPECT_LE(ln.worst_excess_pct, kMaxLossPct)
        << name << ": Kareus's own frontier loses to Nanobatching+Perseus at " << ln.lost << " of "
        << ln.deadlines << " deadlines (" << ln.from_s << ".." << ln.to_s << " s)";
    const double megatron_s = w.at("megatron").at("iteration_time_s").get<double>();
    const double nanobatch_s = w.at("nanobatch").at("iteration_time_s").get<double>();
    const double perseus_fast = pct_over(fastest_s(w.at("perseus")), megatron_s);
    const double nbp_fast = pct_over(fastest_s(w.at("nanobatch_perseus")), nanobatch_s);
    const double kareus_fast = pct_over(fastest_s(own), nanobatch_s);
    EXPECT_LE(perseus_fast, kMaxFastEndPct) << name << ": Perseus's fastest vs Megatron-LM";
    EXPECT_LE(nbp_fast, kMaxFastEndPct) << name << ": Nanobatching+Perseus's fastest vs NB";
    EXPECT_LE(kareus_fast, kMaxFastEndPct) << name << ": Kareus's fastest vs Nanobatching";
    table += fmt::format(
        "| {} | {} | {:.2f}% | {:.2f}% | {:.2f}% | {:.2f}% ({}/{}) | {:.2f}% ({}/{}) | {:+.3f}% | "
        "{:+.3f}% | {:+.3f}% |\n",
        name, w.at("gpus").get<int>(), w.at("iso_time_energy_saving_pct").get<double>(),
        w.at("iso_energy_time_saving_pct").get<double>(),
        w.at("max_throughput_time_saving_pct").get<double>(), lp.worst_excess_pct, lp.lost,
        lp.deadlines, ln.worst_excess_pct, ln.lost, ln.deadlines, perseus_fast, nbp_fast,
        kareus_fast);
  }
  std::cout << table;
  return table;
}

TEST(Zoo, NeverWorseThanBaselinesAndHonestFastEnds) {
  const std::string table = check_suite("workloads/zoo", 24);
  if (const char* path = std::getenv("KAREUS_ZOO_TABLE")) std::ofstream(path) << table;
}

// The mixture-of-experts suite (workloads/moe): all-to-all partitions with the copy engines as
// an option inside a node and over the network across nodes.
TEST(Zoo, MixtureOfExpertsNeverWorseThanBaselines) {
  const std::string table = check_suite("workloads/moe", 4);
  if (const char* path = std::getenv("KAREUS_MOE_TABLE")) std::ofstream(path) << table;
}

}  // namespace
}  // namespace kareus
