// Helpers shared by the tests: paths, temporary files and running the CLI as a user would.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kareus/partition.h"
#include "kareus/profiler.h"

namespace kareus::test {

inline std::string source_path(const std::string& rel) {
  return std::string(KAREUS_SOURCE_DIR) + "/" + rel;
}

/// The paper suite's 14 workloads (brief section 8), named as in issue 2.
inline const char* const kPaperWorkloads[] = {
    "llama3.2-3b_tp8_mbs8_seq4096",    "llama3.2-3b_tp8_mbs8_seq8192",
    "llama3.2-3b_tp8_mbs16_seq4096",   "llama3.2-3b_cp2tp4_mbs8_seq4096",
    "llama3.2-3b_cp2tp4_mbs8_seq8192", "llama3.2-3b_cp2tp4_mbs16_seq4096",
    "qwen3-1.7b_tp8_mbs8_seq4096",     "qwen3-1.7b_tp8_mbs8_seq8192",
    "qwen3-1.7b_tp8_mbs16_seq4096",    "qwen3-1.7b_cp2tp4_mbs8_seq4096",
    "qwen3-1.7b_cp2tp4_mbs8_seq8192",  "qwen3-1.7b_cp2tp4_mbs16_seq4096",
    "llama3.3-70b_tp8_mbs2_seq4096",   "llama3.3-70b_tp8_mbs4_seq4096"};

inline std::string paper_workload(const std::string& name) {
  return source_path("workloads/paper/" + name + ".yaml");
}

/// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kareus-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs `kareus ARGS` through the shell; captures stdout, stderr and the exit code.
inline CommandResult run_cli(const std::string& args) {
  TempDir tmp;
  const std::string out = tmp.file("out"), err = tmp.file("err");
  const std::string cmd =
      std::string(KAREUS_CLI) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

/// Emulator profiler options as most tests use them: the workload's GPU, 1% noise, seed 1.
/// A square bf16 GEMM, 8192^3: compute-bound on every SM, the heaviest load the emulator knows.
inline Kernel big_gemm() {
  Kernel g;
  g.name = "gemm";
  g.kind = OpKind::kGemm;
  g.m = g.n = g.k = 8192;
  g.flops = 2.0 * 8192.0 * 8192 * 8192;
  g.bytes_read = 2.0 * 8192 * 8192 * 2;
  g.bytes_written = 8192.0 * 8192 * 2;
  return g;
}

inline ProfilerOptions emulator_options(const std::string& gpu, double noise = 0.01,
                                        std::uint64_t seed = 1) {
  ProfilerOptions o;
  o.gpu = gpu;
  o.noise = noise;
  o.seed = seed;
  return o;
}

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// A plan JSON's predicted energy of one GPU of `stage` per iteration, computed from the file by
/// the rule docs/formats.md gives ("Energy-monitor records"): the stage's instructions' dynamic
/// energy, the static power over the iteration, an equal share of the rest of energy_j.
inline double plan_gpu_energy_j(const nlohmann::json& plan, std::size_t stage) {
  const double t = plan["iteration_time_s"].get<double>();
  const double static_j = plan["static_power_w"].get<double>() * t;
  double rest = plan["energy_j"].get<double>(), gpus = 0, mine = 0;
  for (std::size_t s = 0; s < plan["stages"].size(); ++s) {
    double dynamic = 0;
    for (const auto& in : plan["stages"][s]["instructions"]) {
      dynamic += in["dynamic_energy_j"].get<double>();
    }
    const double n = static_cast<double>(plan["stages"][s]["ranks"].size());
    rest -= n * (dynamic + static_j);
    gpus += n;
    if (s == stage) mine = dynamic + static_j;
  }
  return mine + (rest > 0 ? rest : 0) / gpus;
}

/// A job that cannot fit: Llama 3.3 70B on 8 A40, TP8 PP1, micro-batch 8, sequence 8192.
inline constexpr const char* kSeventyBOnA40 = R"(model: llama3.3-70b
gpu: a40
cluster: {nodes: 1, gpus_per_node: 8}
parallel: {tp: 8, pp: 1}
batch: {micro_batch: 8, seq_len: 8192, micro_batches: 8}
recompute: full
)";

}  // namespace kareus::test
