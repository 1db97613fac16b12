// Test helper: a stand-in training process. Starts a frequency controller (kareus-freqd against
// the NVML library given, or in dry-run mode), asks for FREQ_MHZ, prints "controller <pid>" and
// sleeps until it is killed (at most 60 s).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kareus/runtime.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: controller_client_helper NVML_LIB|dry LOG FREQ_MHZ GPU\n");
    return 2;
  }
  kareus::runtime::ControllerOptions o;
  o.executable = KAREUS_FREQD;
  o.dry_run = std::string(argv[1]) == "dry";
  if (!o.dry_run) o.nvml_library = argv[1];
  o.log_path = argv[2];
  o.gpu_index = std::atoi(argv[4]);
  try {
    auto controller = kareus::runtime::FrequencyController::start(o);
    controller->set_clock(std::atoi(argv[3]));
    std::printf("controller %d\n", static_cast<int>(controller->pid()));
    std::fflush(stdout);
    for (int i = 0; i < 600; ++i) usleep(100000);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "controller_client_helper: %s\n", e.what());
    return 1;
  }
  return 0;
}
