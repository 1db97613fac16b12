// The CLI's flags, run through the real `kareus` binary: every bad flag fails at once (exit 2,
// naming the flag, the value and what is allowed) before any search or profiling starts, and
// the verbs share one convention (--json a switch, positional inputs, natural defaults).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "test_util.h"

namespace kareus {
namespace {

const std::string kLlama = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");

/// Runs `kareus ARGS` in `dir` (the working directory matters for default paths).
test::CommandResult run_in(const std::string& dir, const std::string& args) {
  return test::run_cli("--version >/dev/null; cd '" + dir + "' && " + KAREUS_CLI + " " + args);
}

/// The longest run of digits in `s`: a message must not print 1e308 as 309 digits.
std::size_t longest_digit_run(const std::string& s) {
  std::size_t best = 0, run = 0;
  for (char c : s) {
    run = std::isdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    best = std::max(best, run);
  }
  return best;
}

struct BadFlag {
  std::string args;     ///< after `kareus VERB WORKLOAD`
  std::string needles;  ///< '|'-separated substrings the error must contain
};

// Each measurement takes 20 s of wall time (--emulate-profiling-delay-ms): a run that measured
// even one point could not finish within the bound below, so an error inside it proves the
// flag was refused before any profiling. The bound leaves room for a slow start (sanitizer
// builds, a loaded machine).
constexpr const char* kSlow = " --emulate-profiling-delay-ms 20000 --quiet";
constexpr double kImmediateS = 10.0;

void expect_immediate_errors(const std::string& verb, const std::vector<BadFlag>& cases) {
  for (const auto& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = test::run_cli(verb + " " + kLlama + " " + c.args + kSlow);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 2) << verb << " " << c.args << ": " << r.err;
    EXPECT_LT(s, kImmediateS) << verb << " " << c.args << " took " << s << " s";
    std::size_t start = 0;
    while (start <= c.needles.size()) {
      const std::size_t bar = c.needles.find('|', start);
      const std::string needle =
          c.needles.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
      EXPECT_NE(r.err.find(needle), std::string::npos)
          << verb << " " << c.args << ": '" << needle << "' not in: " << r.err;
      if (bar == std::string::npos) break;
      start = bar + 1;
    }
    EXPECT_LT(longest_digit_run(r.err), 20u) << r.err;
  }
}

TEST(CliFlags, PlanRefusesBadFlagsBeforeSearching) {
  test::TempDir tmp;
  const std::string out = " --out " + tmp.file("p.json");
  const std::string not_sqlite = tmp.write("notes.txt", "not a database\n");
  expect_immediate_errors(
      "plan",
      {
          {"--deadline -1" + out, "--deadline|-1|finite number of seconds > 0"},
          {"--deadline nan" + out, "--deadline|nan|finite"},
          {"--deadline inf" + out, "--deadline|inf|finite"},
          {"--deadline 1e308" + out, "--deadline|1e308|<= 1e+06"},
          {"--deadline 1e999" + out, "--deadline|1e999"},
          {"--energy-budget 0" + out, "--energy-budget|'0'|> 0"},
          {"--power-cap-w 0" + out, "--power-cap-w|'0'|finite number of watts per GPU > 0"},
          {"--power-cap-w -350" + out, "--power-cap-w|-350|> 0"},
          {"--power-cap-w nan" + out, "--power-cap-w|nan|finite"},
          {"--power-cap-w inf" + out, "--power-cap-w|inf|finite"},
          {"--power-cap-w 1e6" + out, "--power-cap-w|1e6|<= 100000"},
          {"--job-power-cap-kw 0" + out, "--job-power-cap-kw|'0'|finite number of kilowatts > 0"},
          {"--job-power-cap-kw -2" + out, "--job-power-cap-kw|-2"},
          {"--job-power-cap-kw nan" + out, "--job-power-cap-kw|nan|finite"},
          {"--power-cap-w 350 --job-power-cap-kw 5" + out,
           "--power-cap-w|excludes|--job-power-cap-kw"},
          {"--power-cap-w 350 --deadline 5" + out, "--power-cap-w|excludes|--deadline"},
          {"--job-power-cap-kw 5 --max-throughput" + out, "--job-power-cap-kw|excludes"},
          {"--max-throughput --unit 0" + out, "--unit|'0'|>= 1e-06"},
          {"--max-throughput --unit -0.5" + out, "--unit|-0.5"},
          {"--max-throughput --unit nan" + out, "--unit|nan"},
          {"--max-throughput --budget 0" + out, "--budget|'0'|1..1000000"},
          {"--max-throughput --budget -3" + out, "--budget|-3"},
          {"--max-throughput --stop-threshold 2" + out, "--stop-threshold|2|hypervolume fraction"},
          {"--max-throughput --stop-patience 0" + out, "--stop-patience|'0'|batches"},
          {"--max-throughput --batch-size 0" + out, "--batch-size|'0'|points"},
          {"--max-throughput --noise nan" + out, "--noise|nan"},
          {"--max-throughput --min-clock-hold-ms -1" + out, "--min-clock-hold-ms|-1"},
          {"--max-throughput --clock-switch-ms inf" + out, "--clock-switch-ms|inf"},
          {"--max-throughput --strategy annealing" + out, "--strategy annealing"},
          {"--max-throughput --method fastest" + out, "fastest"},
          {"--max-throughput --out " + tmp.path(), "--out|is a directory"},
          {"--max-throughput --out " + tmp.file("missing/p.json"), "--out|does not exist"},
          {"--max-throughput --db /dev/null" + out, "--db /dev/null|profile store"},
          {"--max-throughput --db " + not_sqlite + "/x.db" + out,
           "--db " + not_sqlite + "/x.db|" + not_sqlite + " is not a directory|Not a directory"},
          {"--max-throughput --db " + tmp.path() + out, "--db|is a directory"},
          {"--max-throughput --db " + not_sqlite + out, "--db " + not_sqlite + "|not a usable"},
      });
  EXPECT_FALSE(std::filesystem::exists(tmp.file("p.json")));
}

TEST(CliFlags, OtherVerbsRefuseBadFlagsBeforeWorking) {
  test::TempDir tmp;
  expect_immediate_errors("frontier", {{"--unit 0", "--unit"},
                                       {"--dump-dag " + tmp.path(), "--dump-dag|is a directory"},
                                       {"--window-s 0", "--window-s"},
                                       {"--cooldown-s -1", "--cooldown-s"}});
  expect_immediate_errors("optimize", {{"--out " + tmp.write("f", "x") + " --budget 0", "--budget"},
                                       {"--out " + tmp.file("f"), "--out|not a directory"}});
  expect_immediate_errors("search", {{"--partition fwd_mlp --budget 0", "--budget"},
                                     {"--partition fwd_mlp --stop-threshold 2", "--stop-threshold"},
                                     {"--partition fwd_mlp --initial-design sobol", "sobol"},
                                     {"--partition fwd_mlp --ask " + tmp.path(), "--ask"}});
  expect_immediate_errors("profile", {{"--sweep --db /dev/null", "--db /dev/null"},
                                      {"--sweep --static-power", "choose one"},
                                      {"--points " + tmp.file("none.csv"), "--points|no such"}});
  expect_immediate_errors(
      "emulate", {{"--clock-switch-ms nan", "--clock-switch-ms"}, {"--freq -5", "--freq"}});
}

TEST(CliFlags, DeadlineBelowTheFastestPointNamesTheBound) {
  test::TempDir tmp;
  const auto r = test::run_cli("plan " + kLlama + " --deadline 1e-3 --budget 8 --quiet --out " +
                               tmp.file("p.json"));
  ASSERT_EQ(r.exit_code, 2) << r.err;
  // "--deadline 0.001: infeasible with --margin 0.005: the fastest plan is predicted at T s per
  // iteration; allowed: >= T / (1 - 0.005) s".
  const std::regex re(
      "--deadline 0\\.001: infeasible with --margin 0\\.005: the fastest plan is predicted at "
      "([0-9.]+) s per iteration; allowed: >= ([0-9.]+) s");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, re)) << r.err;
  EXPECT_NEAR(std::stod(m[2]), std::stod(m[1]) / (1 - 0.005), 1e-4 * std::stod(m[1])) << r.err;
  EXPECT_LT(longest_digit_run(r.err), 8u) << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("p.json")));
}

TEST(CliFlags, EvalSuiteFolderWithJsonSwitch) {
  test::TempDir tmp;
  const std::string suite = tmp.path() + "/suite";
  std::filesystem::create_directories(suite);
  std::filesystem::copy_file(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096"),
                             suite + "/b.yaml");
  std::filesystem::copy_file(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"),
                             suite + "/a.yaml");
  std::ofstream(suite + "/notes.txt") << "not a workload\n";
  const auto r = test::run_cli("eval --suite " + suite + " --json --budget 16 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);  // stdout is exactly the JSON
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0].at("workload"), "a");  // named by file, sorted by file name
  EXPECT_EQ(j[1].at("workload"), "b");
  EXPECT_EQ(j[0].at("gpus"), 16);

  // --out writes the same JSON to a file; the old `--json FILE` form is refused.
  const auto w = test::run_cli("eval --suite " + suite + " --json --budget 16 --quiet --out " +
                               tmp.file("e.json"));
  ASSERT_EQ(w.exit_code, 0) << w.err;
  // Same JSON apart from the wall-clock field.
  auto written = nlohmann::json::parse(test::read_file(tmp.file("e.json")));
  auto printed = j;
  for (auto* v : {&written, &printed})
    for (auto& e : *v) e.erase("seconds");
  EXPECT_EQ(written, printed);
  EXPECT_EQ(test::run_cli("eval --suite " + suite + " --json " + tmp.file("x.json")).exit_code, 2);

  for (const std::string& bad : {tmp.file("absent"), tmp.path() + "/suite/a.yaml"}) {
    const auto e = test::run_cli("eval --suite " + bad + " --quiet");
    EXPECT_EQ(e.exit_code, 2) << bad;
    EXPECT_NE(e.err.find("--suite " + bad), std::string::npos) << e.err;
  }
  std::filesystem::create_directories(tmp.path() + "/empty");
  const auto e = test::run_cli("eval --suite " + tmp.path() + "/empty --quiet");
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_NE(e.err.find("no *.yaml"), std::string::npos) << e.err;
  EXPECT_EQ(test::run_cli("eval --jobs 0").exit_code, 2);
  EXPECT_EQ(test::run_cli("eval --out " + tmp.path()).exit_code, 2);
}

TEST(CliFlags, ProfileSweepDefaultsToTheSharedStore) {
  test::TempDir tmp;
  const auto r =
      run_in(tmp.path(), "profile " + kLlama + " --sweep --partition fwd_mlp --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("db"), "out/profiles.db");
  EXPECT_TRUE(std::filesystem::is_regular_file(tmp.file("out/profiles.db")));
  // A second sweep reuses every point from that store.
  const auto again =
      run_in(tmp.path(), "profile " + kLlama + " --sweep --partition fwd_mlp --json --quiet");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto j2 = nlohmann::json::parse(again.out);
  EXPECT_EQ(j2.at("measured"), 0);
  EXPECT_EQ(j2.at("reused"), j.at("configs"));
}

TEST(CliFlags, FrontierSummarisesUnlessAll) {
  const std::string w = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const auto js = test::run_cli("frontier " + w + " --budget 16 --quiet --json");
  ASSERT_EQ(js.exit_code, 0) << js.err;
  const std::size_t n = nlohmann::json::parse(js.out).at("points").size();
  ASSERT_GT(n, 10u);
  // Table rows start with the iteration time: count the lines that do.
  auto rows = [](const std::string& out) {
    std::size_t count = 0;
    const std::regex row("^\\s*[0-9]+\\.[0-9]{4}\\s");
    std::stringstream ss(out);
    for (std::string line; std::getline(ss, line);) count += std::regex_search(line, row);
    return count;
  };
  const auto summary = test::run_cli("frontier " + w + " --budget 16 --quiet");
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_EQ(rows(summary.out), 10u) << summary.out;
  EXPECT_NE(summary.out.find(fmt::format("showing 10 of {} points", n)), std::string::npos)
      << summary.out;
  const auto all = test::run_cli("frontier " + w + " --budget 16 --quiet --all");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(rows(all.out), n);
}

TEST(CliFlags, CalibrateDefaultsToTheShippedData) {
  // --no-fit: the committed parameters' errors (a refit takes minutes; FitReproducesCommitted-
  // Defaults checks it reproduces them).
  const auto r = test::run_cli("calibrate --no-fit --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("residuals").size(), 3u);
  EXPECT_LT(j.at("rms_error").get<double>(), 0.07);  // committed fit: 6.1%
  EXPECT_EQ(j.at("evaluations").get<int>(), 0);
  const auto csv =
      test::source_path("data/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv");
  const auto explicit_args =
      test::run_cli("calibrate " + csv + " --workload " + kLlama + " --no-fit --json");
  ASSERT_EQ(explicit_args.exit_code, 0) << explicit_args.err;
  EXPECT_EQ(nlohmann::json::parse(explicit_args.out), j);
  const auto missing = test::run_cli("calibrate /nonexistent.csv");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("/nonexistent.csv"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace kareus
