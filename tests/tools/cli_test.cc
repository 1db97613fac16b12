#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "kareus/plan.h"
#include "kareus/store.h"
#include "test_util.h"

namespace kareus {
namespace {

TEST(Cli, WorkloadShowJson) {
  const auto r = test::run_cli("workload show " +
                               test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> keys;
  for (const auto& p : j.at("partitions")) {
    keys.insert(p.at("key").get<std::string>());
    EXPECT_TRUE(p.at("collective").contains("bytes"));
    EXPECT_FALSE(p.at("launch_slots").empty());
    EXPECT_GT(p.at("repeats").get<int>(), 0);
    EXPECT_GT(p.at("compute_ops").at(0).at("bytes").get<double>(), 0);
  }
  EXPECT_EQ(keys, (std::set<std::string>{"fwd_attn", "fwd_mlp", "bwd_attn", "bwd_mlp"}));
  EXPECT_GT(j.at("model_flops_per_iteration").get<double>(), 0);
  EXPECT_GT(j.at("hardware_flops_per_iteration").get<double>(),
            j.at("model_flops_per_iteration").get<double>());
  EXPECT_EQ(j.at("segments").at(0).at("name"), "embedding");
}

TEST(Cli, WorkloadShowTable) {
  const auto r =
      test::run_cli("workload show " + test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fwd_qkv_ag"), std::string::npos);
  EXPECT_NE(r.out.find("allgather cp/2"), std::string::npos);
}

TEST(Cli, HelpAndBadFlags) {
  EXPECT_EQ(test::run_cli("--help").exit_code, 0);
  EXPECT_EQ(test::run_cli("workload show --help").exit_code, 0);
  EXPECT_EQ(test::run_cli("").exit_code, 2);
  EXPECT_EQ(test::run_cli("frobnicate").exit_code, 2);
  EXPECT_EQ(test::run_cli("workload show x.yaml --bogus").exit_code, 2);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

TEST(Cli, ProfileJsonAndInvalidValues) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto ok = test::run_cli("profile " + wl +
                                " --partition fwd_attn --freq 1410 --sms 24 --slot norm --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  for (const char* k : {"time_s", "energy_j", "dynamic_energy_j", "static_energy_j"}) {
    EXPECT_GT(j.at(k).get<double>(), 0) << k;
  }
  struct Bad {
    std::string args, needle;
  };
  for (const auto& b : std::vector<Bad>{
           {"--partition fwd_attn --freq 1400 --sms 24 --slot norm", "210..1410"},
           // 0 is the copy engines, which this dense job's TP AllReduce cannot use.
           {"--partition fwd_attn --freq 1410 --sms 0 --slot norm",
            "partition fwd_attn allows 1..32 (NCCL's channel limit)"},
           {"--partition fwd_attn --freq 1410 --sms 40 --slot norm", "0..32"},
           {"--partition fwd_attn --freq 1410 --sms 24 --slot fc1", "norm, qkv, rope, attn"},
           {"--partition ffn --freq 1410 --sms 24 --slot norm", "fwd_attn"},
           {"--partition fwd_attn --freq 1410 --sms 24 --slot norm --backend gpu", "emulator"}}) {
    const auto r = test::run_cli("profile " + wl + " " + b.args);
    EXPECT_EQ(r.exit_code, 2) << b.args;
    EXPECT_NE(r.err.find(b.needle), std::string::npos) << b.args << ": " << r.err;
  }
}

TEST(Cli, EmulateJson) {
  const std::string wl = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const auto r = test::run_cli("emulate " + wl + " --schedule nanobatch --freq 1410 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  double per_gpu = 0;
  for (const auto& s : j.at("stages")) per_gpu += s.at("energy_j_per_gpu").get<double>();
  // Whole job: 8 GPUs per stage.
  EXPECT_NEAR(j.at("energy_j").get<double>(), 8 * per_gpu, 1e-6 * per_gpu);
  EXPECT_GT(j.at("iteration_time_s").get<double>(), 0);
  EXPECT_EQ(test::run_cli("emulate " + wl + " --schedule fast").exit_code, 2);
  EXPECT_EQ(test::run_cli("emulate " + wl + " --freq 1411").exit_code, 2);
}

}  // namespace
}  // namespace kareus

// ---- Output paths, --db folders, interrupts: docs/cli.md, "Conventions".

namespace kareus {
namespace {

const std::string kLlama3b = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");

// Every emulated measurement takes 20 s: a run that measured one point could not fail within
// kImmediateS, so a failure inside it proves the check came before any work.
constexpr const char* kSlowMeasure = " --emulate-profiling-delay-ms 20000 --quiet";
constexpr double kImmediateS = 10.0;

struct Timed {
  test::CommandResult r;
  double seconds = 0;
};
Timed run_timed(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t{test::run_cli(args), 0};
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

// The OS's reason for refusing a new file in `dir` (what kareus must quote), or "" when this
// process may create files there.
std::string create_refusal(const std::string& dir) {
  const std::string probe = dir + "/kareus-cli-test-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    return "";
  }
  return std::strerror(errno);
}

TEST(CliOutputs, UnwritablePathsFailBeforeAnyWorkWithTheOsReason) {
  test::TempDir tmp;
  const std::string file = tmp.write("a-file", "x\n");  // a path under it: ENOTDIR, even as root
  const std::string db = tmp.file("good/profiles.db");  // a valid store that must not appear
  const std::string not_dir = std::strerror(ENOTDIR);   // "Not a directory"
  struct Case {
    std::string args, flag, path;
  };
  const std::vector<Case> cases = {
      {"plan " + kLlama3b + " --max-throughput --db " + db + " --out " + file + "/p.json", "--out",
       file + "/p.json"},
      {"plan " + kLlama3b + " --max-throughput --out " + tmp.file("p.json") + " --db " + file +
           "/sub/x.db",
       "--db", file + "/sub/x.db"},
      {"optimize " + kLlama3b + " --db " + db + " --out " + file + "/o", "--out", file + "/o"},
      {"frontier " + kLlama3b + " --db " + db + " --dump-dag " + file + "/d.json", "--dump-dag",
       file + "/d.json"},
      {"search " + kLlama3b + " --partition fwd_mlp --db " + db + " --ask " + file + "/a.csv",
       "--ask", file + "/a.csv"},
      {"profile " + kLlama3b + " --sweep --db " + file + "/p.db", "--db", file + "/p.db"},
      {"profile " + kLlama3b + " --points " + file + " --append " + file + "/t.csv", "--append",
       file + "/t.csv"},
      {"eval --db " + db + " --out " + file + "/e.json", "--out", file + "/e.json"},
      {"eval --db " + db + " --report " + file + "/r.md", "--report", file + "/r.md"},
  };
  for (const auto& c : cases) {
    const Timed t = run_timed(c.args + kSlowMeasure);
    EXPECT_EQ(t.r.exit_code, 2) << c.args << ": " << t.r.err;
    EXPECT_LT(t.seconds, kImmediateS) << c.args;
    // "--out DIR/a-file/p.json: DIR/a-file is not a directory (Not a directory); allowed: ..."
    EXPECT_NE(t.r.err.find(c.flag + " " + c.path + ": " + file + " is not a directory (" + not_dir +
                           "); allowed: "),
              std::string::npos)
        << c.args << ": " << t.r.err;
  }
  // plan show checks --png before it reads the plan.
  const auto png =
      test::run_cli("plan show " + tmp.file("absent.json") + " --png " + file + "/t.png");
  EXPECT_EQ(png.exit_code, 2);
  EXPECT_NE(png.err.find("--png " + file + "/t.png: " + file + " is not a directory"),
            std::string::npos)
      << png.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("good"))) << "a store was created before a check";
  EXPECT_FALSE(std::filesystem::exists(tmp.file("p.json")));

  // A place the OS refuses (sysfs, procfs: even root cannot create files there): the message
  // quotes the OS's own reason, whatever it is on this machine.
  int checked = 0;
  for (const std::string& dir : {std::string("/sys"), std::string("/proc")}) {
    const std::string reason = create_refusal(dir);
    if (reason.empty()) continue;
    ++checked;
    for (const std::string& args :
         {"plan " + kLlama3b + " --max-throughput --out " + dir + "/kareus-p.json",
          "optimize " + kLlama3b + " --out " + dir + "/kareus-out",
          "profile " + kLlama3b + " --sweep --db " + dir + "/kareus/x.db"}) {
      const Timed t = run_timed(args + kSlowMeasure);
      EXPECT_EQ(t.r.exit_code, 2) << args << ": " << t.r.err;
      EXPECT_LT(t.seconds, kImmediateS) << args;
      EXPECT_NE(t.r.err.find("cannot create files in the folder " + dir + " (" + reason + ")"),
                std::string::npos)
          << args << ": " << t.r.err;
    }
  }
  if (checked == 0) GTEST_SKIP() << "/sys and /proc take new files here";
}

TEST(CliOutputs, OptimizeChecksWhatItWritesInsideAnExistingOut) {
  test::TempDir tmp;
  std::filesystem::create_directories(tmp.file("o/report.md"));  // a folder where a file goes
  const Timed t = run_timed("optimize " + kLlama3b + " --out " + tmp.file("o") + kSlowMeasure);
  EXPECT_EQ(t.r.exit_code, 2) << t.r.err;
  EXPECT_LT(t.seconds, kImmediateS);
  EXPECT_NE(t.r.err.find("--out " + tmp.file("o") + ": " + tmp.file("o/report.md") +
                         " is a directory (" + std::strerror(EISDIR) + ")"),
            std::string::npos)
      << t.r.err;
}

TEST(CliOutputs, DbCreatesItsMissingFolders) {
  test::TempDir tmp;
  const std::string db = tmp.file("out/nested/profiles.db");
  const auto r =
      test::run_cli("profile " + kLlama3b +
                    " --partition fwd_attn --freq 1410 --sms 24 --slot norm --json --db " + db);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(std::filesystem::is_regular_file(db));
  EXPECT_EQ(ProfileStore(db).count_all(), 1u);
  // The same point again is served from the store: still one row.
  ASSERT_EQ(test::run_cli("profile " + kLlama3b +
                          " --partition fwd_attn --freq 1410 --sms 24 --slot norm --db " + db)
                .exit_code,
            0);
  EXPECT_EQ(ProfileStore(db).count_all(), 1u);
}

// A number beyond int used to stop at "Could not convert: --freq = 99999999999", without the
// limit; now every such flag names its range while the command line is parsed.
TEST(CliLimits, NumbersBeyondIntNameTheLimit) {
  struct Case {
    std::string args, expected;
  };
  const std::string one = "profile " + kLlama3b + " --partition fwd_attn";
  for (const auto& c : std::vector<Case>{
           {one + " --freq 99999999999 --sms 24 --slot norm",
            "--freq: '99999999999' is not allowed: an integer number of MHz in 1..100000"},
           {one + " --freq 1410 --sms 99999999999 --slot norm",
            "--sms: '99999999999' is not allowed: an integer number of SMs in 0..32"},
           {one + " --freq 1410 --sms 24 --slot norm --backend cuda --devices 0,99999999999999",
            "--devices: '99999999999999' is not allowed: an integer number of device index in "
            "0..1023"},
           {"emulate " + kLlama3b + " --freq 99999999999",
            "--freq: '99999999999' is not allowed: an integer number of MHz in 1..100000"},
       }) {
    const auto r = test::run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.args << ": " << r.err;
  }
}

// A running `kareus ARGS` with its stderr on a pipe (stdout to a file), to be signalled.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args, const std::string& out_path) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      // A test run from a background shell job would pass SIGINT ignored: kareus keeps an
      // ignored SIGINT ignored, so give it the default, as an interactive shell does.
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::dup2(fds[1], STDERR_FILENO);
      const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(out, STDOUT_FILENO);
      ::close(fds[0]);
      std::vector<char*> argv;
      std::string exe = KAREUS_CLI;
      argv.push_back(exe.data());
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(KAREUS_CLI, argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  /// Reads stderr until `re` matches the text so far, or `timeout_s` passes; true on a match.
  bool wait_for(const std::regex& re, double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!std::regex_search(err_, re)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            end - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return std::regex_search(err_, re);
      err_.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  /// Waits for the exit (reading the rest of stderr); the exit code, or 128 + signal.
  int wait() {
    char buf[4096];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof buf)) > 0;)
      err_.append(buf, static_cast<std::size_t>(n));
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  const std::string& err() const { return err_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string err_;
};

std::vector<std::string> split_args(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string a; ss >> a;) out.push_back(a);
  return out;
}

TEST(CliInterrupt, SigintKeepsTheMeasurementsAndTheRerunResumes) {
  test::TempDir tmp;
  const std::string db = tmp.file("out/profiles.db");
  // 20 ms per measurement: the search's 128 points take a few seconds, time to interrupt it.
  const std::string args = "optimize " + kLlama3b + " --out " + tmp.file("o") + " --db " + db +
                           " --budget 32 --emulate-profiling-delay-ms 20";
  Child child(split_args(args), tmp.file("stdout"));
  // Off a terminal the bar prints a line per tenth: wait for the search to be 10% done.
  ASSERT_TRUE(child.wait_for(std::regex("search \\[[#-]+\\] [0-9]+/[0-9]+ +[1-9][0-9]%"), 120))
      << child.err();
  child.signal(SIGINT);
  const int rc = child.wait();
  EXPECT_EQ(rc, 130) << child.err();
  // "kareus: interrupted (SIGINT): N measurements kept in DB (N taken by this run); rerun the
  // same command with --db DB to resume ..."
  const std::regex msg("kareus: interrupted \\(SIGINT\\): ([0-9]+) measurements? kept in " + db +
                       " \\(([0-9]+) taken by this run\\); rerun the same command with --db " + db +
                       " to resume");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(child.err(), m, msg)) << child.err();
  const std::size_t kept = std::stoul(m[1]);
  EXPECT_GT(kept, 0u);
  EXPECT_EQ(std::stoul(m[2]), kept);  // the store was new
  EXPECT_EQ(ProfileStore(db).count_all(), kept);
  EXPECT_FALSE(std::filesystem::exists(tmp.file("o/frontier.json"))) << "wrote partial output";

  // The same command again reuses every kept point and measures only the rest.
  const auto again = test::run_cli(args + " --json --quiet");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto prof = nlohmann::json::parse(again.out).at("profiling");
  EXPECT_EQ(prof.at("reused").get<std::size_t>(), kept);
  const auto measured = prof.at("measured").get<std::size_t>();
  EXPECT_GT(measured, 0u);
  EXPECT_EQ(prof.at("points").get<std::size_t>(), kept + measured);
  EXPECT_EQ(ProfileStore(db).count_all(), kept + measured);
  EXPECT_TRUE(std::filesystem::exists(tmp.file("o/frontier.json")));
}

TEST(CliInterrupt, SigtermWithoutDbSaysNothingWasKeptAndHowToKeepIt) {
  test::TempDir tmp;
  Child child(split_args("search " + kLlama3b +
                         " --partition fwd_mlp --budget 64 --emulate-profiling-delay-ms 50"),
              tmp.file("stdout"));
  ASSERT_TRUE(child.wait_for(std::regex("search fwd_mlp .*\\] [1-9][0-9]*/64"), 120))
      << child.err();
  child.signal(SIGTERM);
  EXPECT_EQ(child.wait(), 143) << child.err();
  EXPECT_NE(child.err().find("kareus: interrupted (SIGTERM): nothing was kept: without --db "
                             "measurements live in memory only; run with --db PATH"),
            std::string::npos)
      << child.err();
  EXPECT_TRUE(test::read_file(tmp.file("stdout")).empty());
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

// Warm starts through the CLI: a store holding one shape of fwd_mlp gives the search of another
// shape the store prior; --warm-start none and --prior emulator override it; bad values exit 2.
TEST(Cli, SearchWarmStartFromTheStoreAndTheEmulatorPrior) {
  test::TempDir tmp;
  const std::string db = tmp.file("warm.db");
  const std::string mbs8 = test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096");
  const std::string mbs16 = test::paper_workload("llama3.2-3b_tp8_mbs16_seq4096");
  const auto first = test::run_cli("search " + mbs8 +
                                   " --partition fwd_mlp --strategy exhaustive --quiet --json "
                                   "--db " +
                                   db);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)["prior"]["name"], "none");  // not mbo
  auto search16 = [&](const std::string& extra) {
    const auto r = test::run_cli("search " + mbs16 + " --partition fwd_mlp --budget 56 --quiet " +
                                 "--json --db " + db + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto warm = search16("");
  EXPECT_EQ(warm["prior"]["name"], "store");
  for (const char* k :
       {"beta_time", "beta_dynamic_energy", "beta_select_time", "beta_select_energy"}) {
    const double b = warm["prior"][k];
    EXPECT_TRUE(b == 0 || b == 0.5 || b == 1) << k << " " << b;
  }
  EXPECT_EQ(search16(" --warm-start none")["prior"]["name"], "none");
  EXPECT_EQ(search16(" --prior emulator")["prior"]["name"], "emulator");
  // Without a store there is nothing to start from.
  const auto cold = test::run_cli("search " + mbs16 +
                                  " --partition fwd_mlp --budget 28 --quiet "
                                  "--json");
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  EXPECT_EQ(nlohmann::json::parse(cold.out)["prior"]["name"], "none");
  const auto bad = test::run_cli("search " + mbs16 + " --partition fwd_mlp --warm-start maybe");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--warm-start"), std::string::npos) << bad.err;
  const auto bad_prior = test::run_cli("frontier " + mbs16 + " --prior oracle");
  EXPECT_EQ(bad_prior.exit_code, 2);
  EXPECT_NE(bad_prior.err.find("--prior"), std::string::npos) << bad_prior.err;
}

// `kareus optimize WORKLOAD --quiet --json --out DIR FLAGS` (exit 0 expected): its JSON and
// DIR/frontier.json.
std::pair<nlohmann::json, nlohmann::json> optimize_json(test::TempDir& tmp,
                                                        const std::string& workload,
                                                        const std::string& out,
                                                        const std::string& flags) {
  const auto r = test::run_cli("optimize " + workload + " --quiet --json --out " + tmp.file(out) +
                               " " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(tmp.file(out + "/frontier.json"));
  return {nlohmann::json::parse(r.out), nlohmann::json::parse(in)};
}

// Smoothed sweeps are on by default, from every 3rd clock, and recorded: a stride of 3 measures
// each segment at 7 of the A100's 18 clocks (every 3rd from 1410 MHz, and 900), so the run
// measures fewer points than with stride 1 or without smoothing (every clock). A stride asked
// for without smoothing, or below 1, exits 2 naming the flag.
TEST(Cli, SweepSmoothingFlagsAreRecordedAndChecked) {
  test::TempDir tmp;
  const std::string qwen = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const auto [def, def_frontier] = optimize_json(tmp, qwen, "default", "--budget 21");
  const auto [every, every_frontier] =
      optimize_json(tmp, qwen, "every", "--budget 21 --sweep-stride 1");
  const auto [raw, raw_frontier] =
      optimize_json(tmp, qwen, "raw", "--budget 21 --no-smooth-sweeps");
  EXPECT_EQ(def_frontier["planner"]["smooth_sweeps"], true);
  EXPECT_EQ(def_frontier["planner"]["sweep_stride"], 3);
  EXPECT_EQ(every_frontier["planner"]["sweep_stride"], 1);
  EXPECT_EQ(raw_frontier["planner"]["smooth_sweeps"], false);
  // Smoothing every clock measures the same points as no smoothing; the stride fewer.
  const int points = every["profiling"]["points"];
  EXPECT_EQ(raw["profiling"]["points"], points);
  EXPECT_LT(def["profiling"]["points"].get<int>(), points);
  for (const std::string bad : {" --no-smooth-sweeps --sweep-stride 2", " --sweep-stride 0"}) {
    const auto r =
        test::run_cli("optimize " + qwen + " --budget 21 --quiet --out " + tmp.file("bad") + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("stride"), std::string::npos) << r.err;
  }
}

// Plan-directed profiling: with --focus-rounds, optimize measures where its first plans run
// (each partition's focus points in --json, the clocks in frontier.json, more points than
// without), and every clock it focused on is one of those plans' clocks. Out-of-range values
// exit 2 naming the flag.
TEST(Cli, FocusRoundsAreRecordedAndChecked) {
  test::TempDir tmp;
  const std::string qwen = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const auto [def, def_frontier] = optimize_json(tmp, qwen, "default", "--budget 28");
  const auto [focus, focus_frontier] =
      optimize_json(tmp, qwen, "focus", "--budget 28 --focus-rounds 1 --focus-points 2");
  EXPECT_EQ(def_frontier["planner"]["focus_rounds"], 0);
  EXPECT_TRUE(def_frontier["planner"]["focus_clocks_mhz"].empty());
  EXPECT_FALSE(def["profiling"].contains("focus_clocks_mhz"));
  EXPECT_EQ(focus_frontier["planner"]["focus_rounds"], 1);
  EXPECT_EQ(focus_frontier["planner"]["focus_points_per_clock"], 2);
  const auto clocks = focus_frontier["planner"]["focus_clocks_mhz"].get<std::vector<int>>();
  ASSERT_FALSE(clocks.empty());
  EXPECT_EQ(focus["profiling"]["focus_clocks_mhz"].get<std::vector<int>>(), clocks);
  // The first round is the default run: its plans' clocks are the ones focused on.
  std::set<int> planned;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.file("default/plans"))) {
    const Plan p = load_plan(entry.path().string());
    for (const auto& st : p.stages)
      for (const auto& ins : st.instructions) planned.insert(ins.freq_mhz);
  }
  EXPECT_EQ(std::vector<int>(planned.begin(), planned.end()), clocks);
  int focus_points = 0, coverage_points = 0;
  for (const auto& p : focus["profiling"]["partitions"]) {
    const int n = p.value("focus_points", 0);
    EXPECT_LE(n, 2 * static_cast<int>(clocks.size())) << p["key"];
    focus_points += n;
    coverage_points += p.value("coverage_points", 0);
  }
  EXPECT_GT(focus_points, 0);
  // Distinct points: a focus point that another part of the run measured too (a baseline's
  // sweep at NCCL's defaults) counts once. The run's clock-coverage points are its own: a clock
  // the focus points reach needs none, and one they do not may be filled by another
  // configuration than the default run's.
  const int def_points = def["profiling"]["points"];
  EXPECT_LE(focus["profiling"]["points"].get<int>(), def_points + focus_points + coverage_points);
  EXPECT_GT(focus["profiling"]["points"].get<int>(), def_points + focus_points / 2);
  // frontier hands out no plan to focus on.
  const auto fr = test::run_cli("frontier " + qwen + " --budget 21 --quiet --focus-rounds 1");
  EXPECT_EQ(fr.exit_code, 2);
  EXPECT_NE(fr.err.find("--focus-rounds"), std::string::npos) << fr.err;
  for (const std::string bad : {" --focus-rounds 9", " --focus-rounds 1 --focus-points 0"}) {
    const auto r =
        test::run_cli("optimize " + qwen + " --budget 21 --quiet --out " + tmp.file("bad") + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("--focus-"), std::string::npos) << r.err;
  }
}

// What the searches knew is part of the result: optimize --json names each partition's prior
// and frontier.json records it with the planning options, so a warm-started frontier is not
// mistaken for a cold one.
TEST(Cli, OptimizeRecordsThePriorPerPartitionAndInTheFrontier) {
  test::TempDir tmp;
  const std::string qwen = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const auto [cold, cold_frontier] = optimize_json(tmp, qwen, "cold", "--budget 28");
  const auto [prior, prior_frontier] =
      optimize_json(tmp, qwen, "prior", "--budget 28 --prior emulator");
  EXPECT_EQ(cold_frontier["planner"]["prior"], "none");
  EXPECT_EQ(prior_frontier["planner"]["prior"], "emulator");
  EXPECT_EQ(prior_frontier["planner"]["clock_completion"], false);
  ASSERT_FALSE(cold["profiling"]["partitions"].empty());
  ASSERT_EQ(cold["profiling"]["partitions"].size(), prior["profiling"]["partitions"].size());
  for (const auto& p : cold["profiling"]["partitions"]) {
    EXPECT_EQ(p["prior"], "none") << p["key"];
    EXPECT_EQ(p["prior_seeded"], false) << p["key"];
  }
  // The emulator knows every partition: each search used it.
  for (const auto& p : prior["profiling"]["partitions"]) EXPECT_EQ(p["prior"], "emulator");
}

// The planner verbs take the search's own flags (tools/kareus/search_flags.h). A stop threshold
// of 1 with patience 1 makes the first batch after the 21-point design flat unless it doubles
// the measured hypervolume, so every search ends at 21 + 7 points instead of its budget of 56.
TEST(Cli, OptimizeStopsEverySearchByTheStopRuleAndRecordsIt) {
  test::TempDir tmp;
  const std::string qwen = test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096");
  const auto r = test::run_cli("optimize " + qwen +
                               " --budget 56 --stop-threshold 1 --stop-patience 1 --quiet --json "
                               "--out " +
                               tmp.file("o"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["profiling"]["partitions"].empty());
  for (const auto& p : j["profiling"]["partitions"]) {
    EXPECT_EQ(p["evaluations"], 28) << p["key"];
  }
  std::ifstream in(tmp.file("o/frontier.json"));
  const auto f = nlohmann::json::parse(in);
  EXPECT_EQ(f["planner"]["budget"], 56);
  EXPECT_EQ(f["planner"]["stop_threshold"], 1.0);
  EXPECT_EQ(f["planner"]["stop_patience"], 1);
  EXPECT_EQ(f["planner"]["initial_points"], 21);
  EXPECT_EQ(f["planner"]["batch_size"], 7);
}

}  // namespace
}  // namespace kareus
