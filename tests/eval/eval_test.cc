// End to end: `kareus optimize` writes a report whose numbers equal its JSON, a plot and plans
// that replay to their predictions; `kareus eval --suite paper` covers all 14 workloads, and
// Kareus's own frontier loses to Perseus and Nanobatching+Perseus no more than recorded.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "kareus/plan.h"
#include "kareus/table.h"
#include "own_frontier_check.h"
#include "test_util.h"

namespace kareus {
namespace {

TEST(Optimize, ReportMatchesJsonPlotAndPlans) {
  test::TempDir tmp;
  const std::string wl = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const std::string out = tmp.file("out");
  const auto r = test::run_cli("optimize " + wl + " --out " + out + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Kareus"), std::string::npos);
  const auto j = nlohmann::json::parse(test::read_file(out + "/frontier.json"));
  const std::string report = test::read_file(out + "/report.md");
  // Every metric in the report's table is the JSON's, to the printed precision.
  const std::pair<const char*, const char*> rows[] = {
      {"iso-time energy saving vs Perseus", "iso_time_energy_saving_pct"},
      {"iso-energy time saving vs Perseus", "iso_energy_time_saving_pct"},
      {"max-throughput time saving vs Megatron-LM", "max_throughput_time_saving_pct"},
      {"max-throughput energy saving vs Megatron-LM", "max_throughput_energy_saving_pct"},
      {"energy increase without frequency scaling", "ablation_no_freq_energy_increase_pct"},
      {"energy increase without kernel scheduling", "ablation_no_sched_energy_increase_pct"}};
  for (const auto& [label, key] : rows) {
    std::smatch m;
    const std::regex re(std::string("\\| ") + label + " \\| (-?[0-9.]+)%");
    ASSERT_TRUE(std::regex_search(report, m, re)) << label;
    EXPECT_NEAR(std::stod(m[1]), j.at(key).get<double>(), 0.005 + 1e-9) << label;
  }
  // The replay table's numbers are the JSON's too.
  for (const auto& rep : j.at("replay")) {
    const std::string line = fmt::format(
        "| {} | {:.4f} | {:.4f} |", rep.at("plan").get<std::string>(),
        rep.at("predicted_time_s").get<double>(), rep.at("emulated_time_s").get<double>());
    EXPECT_NE(report.find(line), std::string::npos) << line;
  }
  // A real PNG with every series in its data.
  const std::string png = test::read_file(out + "/frontier.png");
  ASSERT_GT(png.size(), 10000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_NE(report.find("![time-energy frontiers](frontier.png)"), std::string::npos);
  for (const char* series : {"kareus", "perseus", "nanobatch_perseus", "kareus_max_clock"}) {
    EXPECT_FALSE(j.at(series).empty()) << series;
  }
  EXPECT_GT(j.at("megatron").at("energy_j").get<double>(), 0);
  EXPECT_EQ(j.at("points").size(), j.at("kareus").size());
  // Metrics: the JSON's numbers follow from the job shape, and the table prints them.
  const auto& job = j.at("job");
  const double tokens = job.at("tokens_per_iteration").get<double>();
  const double gpus = job.at("gpus").get<double>();
  EXPECT_DOUBLE_EQ(tokens, 8.0 * 4096 * 8);  // micro-batch 8, sequence 4096, 8 micro-batches
  const auto& mm = j.at("megatron");
  const double mt = mm.at("iteration_time_s").get<double>(), me = mm.at("energy_j").get<double>();
  EXPECT_DOUBLE_EQ(mm.at("metrics").at("tokens_per_s").get<double>(), tokens / mt);
  EXPECT_DOUBLE_EQ(mm.at("metrics").at("tokens_per_s_per_gpu").get<double>(), tokens / mt / gpus);
  EXPECT_DOUBLE_EQ(mm.at("metrics").at("energy_per_token_j").get<double>(), me / tokens);
  EXPECT_DOUBLE_EQ(mm.at("metrics").at("avg_power_per_gpu_w").get<double>(), me / mt / gpus);
  EXPECT_DOUBLE_EQ(mm.at("metrics").at("mfu").get<double>(),
                   job.at("model_flops_per_iteration").get<double>() /
                       (mt * gpus * job.at("peak_flops_per_gpu").get<double>()));
  for (const char* plan : {"max-throughput", "min-energy", "iso-time", "iso-energy"}) {
    EXPECT_GT(j.at("plan_metrics").at(plan).at("mfu").get<double>(), 0.05) << plan;
  }
  EXPECT_NE(report.find("MFU: model FLOPs per iteration, " +
                        human_flops(job.at("model_flops_per_iteration").get<double>())),
            std::string::npos);
  EXPECT_NE(r.out.find(fmt::format("{:.1f}%", 100 * mm.at("metrics").at("mfu").get<double>())),
            std::string::npos)
      << r.out;
  // The profiling cost is one estimate, with its assumptions, in the report and the output.
  const auto& cost = j.at("profiling").at("cost_estimate");
  EXPECT_TRUE(cost.at("estimate").get<bool>());
  EXPECT_EQ(cost.at("points").get<int>(), j.at("profiling").at("points").get<int>());
  const std::string cost_text = fmt::format("{:.1f} GPU-hours", cost.at("gpu_hours").get<double>());
  EXPECT_NE(report.find(cost_text), std::string::npos);
  EXPECT_NE(r.out.find(cost_text), std::string::npos);
  EXPECT_NE(r.out.find("estimate: "), std::string::npos);
  // A timeline per written plan, linked from the report, drawn from the plan's times.
  for (const char* plan : {"max-throughput", "min-energy", "iso-time", "iso-energy"}) {
    const std::string rel = std::string("timelines/") + plan + ".timeline.png";
    EXPECT_EQ(test::read_file(out + "/" + rel).substr(1, 3), "PNG") << rel;
    EXPECT_NE(report.find("(" + rel + ")"), std::string::npos) << rel;
    const auto data =
        nlohmann::json::parse(test::read_file(out + "/timelines/" + plan + ".timeline.data.json"));
    const Plan p = load_plan(out + "/plans/" + plan + ".json");
    ASSERT_EQ(data.at("panels").size(), 2u);  // the plan and Megatron-LM's
    EXPECT_EQ(data.at("panels")[1].at("method"), "megatron");
    const auto& rows = data.at("panels")[0].at("stages");
    ASSERT_EQ(rows.size(), p.stages.size());
    for (std::size_t s = 0; s < rows.size(); ++s) {
      const auto& ins = rows[s].at("instructions");
      ASSERT_EQ(ins.size(), p.stages[s].instructions.size());
      EXPECT_DOUBLE_EQ(ins.back().at("end_s").get<double>(), p.stages[s].instructions.back().end_s);
      EXPECT_DOUBLE_EQ(ins.front().at("start_s").get<double>(),
                       p.stages[s].instructions.front().start_s);
    }
  }
  // The written plans are marked on the frontier plot.
  const auto plot_data = nlohmann::json::parse(test::read_file(out + "/frontier_plot_data.json"));
  int plans_marked = 0;
  for (const auto& m : plot_data.at("marked")) plans_marked += m.at("kind") == "plan";
  EXPECT_EQ(plans_marked, 4);
  // Plans replay to their predictions through the CLI.
  for (const char* plan : {"max-throughput", "min-energy", "iso-time", "iso-energy"}) {
    const std::string path = out + "/plans/" + plan + ".json";
    const Plan p = load_plan(path);
    // Format v2, valid against the workload, and `kareus plan show` summarizes it.
    EXPECT_EQ(nlohmann::json::parse(test::read_file(path)).at("version").get<int>(), 2) << plan;
    const std::string png = out + "/" + plan + ".show.png";
    const auto show = test::run_cli("plan show " + path + " --workload " + wl + " --png " + png);
    EXPECT_EQ(show.exit_code, 0) << plan << ": " << show.err;
    EXPECT_EQ(test::read_file(png).substr(1, 3), "PNG") << plan;
    EXPECT_NE(show.out.find(fmt::format(
                  "MFU {:.1f}%", 100 * j.at("plan_metrics").at(plan).at("mfu").get<double>())),
              std::string::npos)
        << show.out;
    EXPECT_NE(show.out.find("clock changes: " + std::to_string(p.stages[0].clock_changes)),
              std::string::npos)
        << show.out;
    const auto e = test::run_cli("emulate " + wl + " --plan " + path + " --json");
    ASSERT_EQ(e.exit_code, 0) << e.err;
    const auto ej = nlohmann::json::parse(e.out);
    EXPECT_NEAR(ej.at("iteration_time_s").get<double>() / p.iteration_time_s, 1.0, 0.03) << plan;
    EXPECT_NEAR(ej.at("energy_j").get<double>() / p.energy_j, 1.0, 0.03) << plan;
  }
}

TEST(Eval, PaperSuite) {
  test::TempDir tmp;
  const auto r = test::run_cli("eval --suite paper --jobs 2 --quiet --json --out " +
                               tmp.file("e.json") + " --report " + tmp.file("e.md"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(test::read_file(tmp.file("e.json")));
  ASSERT_EQ(j.size(), 14u);
  const std::string report = test::read_file(tmp.file("e.md"));
  for (const auto& w : j) {
    for (const char* k :
         {"workload", "iso_time_energy_saving_pct", "iso_energy_time_saving_pct",
          "max_throughput_time_saving_pct", "max_throughput_energy_saving_pct",
          "ablation_no_freq_energy_increase_pct", "ablation_no_sched_energy_increase_pct",
          "fallback", "kareus", "perseus", "nanobatch_perseus", "megatron"}) {
      ASSERT_TRUE(w.contains(k)) << k;
    }
    const std::string name = w.at("workload");
    // The report's row carries the JSON's numbers.
    EXPECT_NE(report.find(fmt::format("| {} | {:.2f} | {:.2f} |", name,
                                      w.at("iso_time_energy_saving_pct").get<double>(),
                                      w.at("iso_energy_time_saving_pct").get<double>())),
              std::string::npos)
        << name;
    // Every reported plan replays within 3%.
    for (const auto& rep : w.at("replay")) {
      EXPECT_LT(std::abs(rep.at("time_error").get<double>()), 0.03)
          << name << " " << rep.at("plan");
      EXPECT_LT(std::abs(rep.at("energy_error").get<double>()), 0.03)
          << name << " " << rep.at("plan");
    }
  }
  EXPECT_NE(report.find("paper (up to)"), std::string::npos);
  // Kareus's own frontier (not the merged one, which cannot lose to its parts) against each
  // baseline, per workload, against the recorded losses.
  test::check_own_frontier_losses(j);
}

TEST(Eval, BadArguments) {
  EXPECT_EQ(test::run_cli("eval --suite mine").exit_code, 2);
  EXPECT_EQ(test::run_cli("eval --jobs 0").exit_code, 2);
  EXPECT_EQ(test::run_cli("optimize " + test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096") +
                          " --out /proc/forbidden/dir --quiet")
                .exit_code,
            2);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// No shell anywhere: an --out path full of shell syntax is just a folder name. The plot is
// drawn through an argument vector, so nothing in the path runs.
TEST(Optimize, OutPathWithShellSyntaxRunsNothing) {
  test::TempDir tmp;
  const std::string out = "q'; touch PWNED; echo '$(touch PWNED2) `touch PWNED3` x";
  const std::string wl = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (chdir(tmp.path().c_str()) != 0) _exit(126);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl(KAREUS_CLI, KAREUS_CLI, "optimize", wl.c_str(), "--out", out.c_str(), "--budget", "24",
          "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (const char* f : {"PWNED", "PWNED2", "PWNED3"}) {
    EXPECT_FALSE(std::filesystem::exists(tmp.file(f))) << f << " was created: a shell ran";
  }
  EXPECT_TRUE(std::filesystem::exists(tmp.file(out) + "/frontier.png"));
  EXPECT_TRUE(std::filesystem::exists(tmp.file(out) + "/report.md"));
}

}  // namespace
}  // namespace kareus
