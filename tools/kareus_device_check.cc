// `kareus_device_check`: runs the cuda backend end to end on one GPU without changing any card
// setting (scripts/device-check builds and runs it; src/cuda/device_check.h says what it does).
// Exit codes as `kareus`: 0 success, 2 not supported / invalid input, 1 internal error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cuda/device_check.h"
#include "kareus/error.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Measure a workload's partitions on one GPU at its current clock (read-only NVML)"};
  kareus::cuda::DeviceCheckOptions o;
  o.workload =
      std::string(KAREUS_SOURCE_DIR) + "/workloads/paper/llama3.2-3b_tp8_mbs8_seq4096.yaml";
  o.moe_workload =
      std::string(KAREUS_SOURCE_DIR) + "/workloads/moe/qwen3-30b-a3b_h100_ep8_dp8.yaml";
  std::string json_path;
  app.add_option("--workload", o.workload, "workload YAML")->capture_default_str();
  app.add_option("--moe-workload", o.moe_workload,
                 "mixture-of-experts workload for the grouped-GEMM and all-to-all row (\"\": none)")
      ->capture_default_str();
  app.add_option("--device", o.device, "CUDA device index")->capture_default_str();
  app.add_option("--window-s", o.window_s, "measurement window (s)")->capture_default_str();
  app.add_option("--cooldown-s", o.cooldown_s, "cool-down after each point (s)")
      ->capture_default_str();
  app.add_option("--repeats", o.repeats,
                 "rounds over every point, interleaved; 2 or more add a repeatability table")
      ->capture_default_str();
  app.add_option("--sms", o.sms,
                 "SM counts for the collective's proxy (default: NCCL's default CTAs)")
      ->delimiter(',');
  app.add_option("--kernel-workloads", o.kernel_workloads,
                 "workload YAMLs whose GEMM and attention shapes are each timed alone (sweep)")
      ->delimiter(',');
  bool list_kernels = false;
  app.add_flag("--list-kernels", list_kernels,
               "list the sweep's shapes for --kernel-workloads and exit (no device needed)");
  app.add_option("--json", json_path, "also write the table as JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (list_kernels) {
      for (const auto& s : kareus::cuda::kernel_sweep_shapes(o.kernel_workloads)) {
        std::cout << s.key << "  (" << s.uses.size() << " uses)\n";
      }
      return 0;
    }
    const auto j = kareus::cuda::run_device_check(o, std::cout);
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      if (!out) throw kareus::InvalidInput(json_path + ": cannot write");
      out << j.dump(2) << "\n";
    }
    return 0;
  } catch (const kareus::InvalidInput& e) {
    std::fprintf(stderr, "kareus_device_check: error: %s\n", e.what());
    return 2;
  } catch (const kareus::NotSupported& e) {
    std::fprintf(stderr, "kareus_device_check: not supported: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kareus_device_check: internal error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

// Building the CLI can throw too (allocation); nothing escapes main.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kareus_device_check: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kareus_device_check: internal error\n");
  }
  return 1;
}
