// kareus-freqd: the per-GPU frequency controller process. Started by a training process through
// kareus::runtime::FrequencyController (never by a shell); see docs/runtime-controller.md.
// Exit codes: 0 clean exit (end-of-file or parent death), 128+N after signal N (clock reset
// first), 1 internal error, 2 invalid input, 3 NVML unavailable or the feature unsupported.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "kareus/error.h"
#include "kareus/nvml.h"
#include "kareus/runtime.h"

namespace {

// Parses the command line and runs the controller; errors that end it propagate to main.
int run(int argc, char** argv) {
  CLI::App app{
      "kareus-freqd: locks one GPU's SM clock to the targets a training process sends on stdin "
      "(native int32 MHz records, 0 = reset) and resets it on exit, on SIGTERM/SIGINT/SIGHUP "
      "and when the parent dies."};
  kareus::runtime::ControllerDaemonOptions o;
  app.add_option("--gpu", o.gpu_index,
                 "NVML device index (NVML's own order: neither CUDA's nor filtered by "
                 "CUDA_VISIBLE_DEVICES; prefer --gpu-uuid or --pci-bus-id)")
      ->check(CLI::NonNegativeNumber);
  auto* uuid = app.add_option("--gpu-uuid", o.gpu_uuid,
                              "select the GPU by UUID (GPU-..., as `nvidia-smi -L` prints it)");
  app.add_option("--pci-bus-id", o.pci_bus_id,
                 "select the GPU by PCI bus id (e.g. 00000000:3B:00.0, as "
                 "`nvidia-smi --query-gpu=pci.bus_id --format=csv` prints it)")
      ->excludes(uuid);
  app.add_flag("--dry-run", o.dry_run, "log transitions to --log instead of touching NVML");
  app.add_option("--log", o.log_path, "JSON-lines transition log (appended)");
  app.add_option("--nvml-library", o.nvml_library,
                 "NVML library to load (default: $KAREUS_NVML_LIBRARY, else libnvidia-ml.so.1)");
  app.add_flag("--coalesce", o.coalesce, "apply only the newest of the waiting targets");
  app.add_option("--ready-fd", o.ready_fd, "descriptor that gets 'R' once running");
  app.add_option("--parent-pid", o.parent_pid, "pid of the client; exit at once if it is gone");
  app.footer(
      "Runs in its own process group when started by FrequencyController, so a terminal's "
      "Ctrl-C does not reach it; it ends on end-of-file on stdin (dropping queued targets), "
      "SIGTERM/SIGINT/SIGHUP or its parent's death, and resets the clock first.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  return kareus::runtime::run_controller_daemon(o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kareus::InvalidInput& e) {
    std::fprintf(stderr, "kareus-freqd: error: %s\n", e.what());
    return 2;
  } catch (const kareus::nvml::NvmlUnavailable& e) {
    std::fprintf(stderr, "kareus-freqd: NVML unavailable: %s\n", e.what());
    return 3;
  } catch (const kareus::nvml::NvmlNotSupported& e) {
    std::fprintf(stderr, "kareus-freqd: not supported: %s\n", e.what());
    return 3;
  } catch (const kareus::NotSupported& e) {
    std::fprintf(stderr, "kareus-freqd: not supported: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kareus-freqd: internal error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "kareus-freqd: internal error: unknown exception\n");
    return 1;
  }
}
