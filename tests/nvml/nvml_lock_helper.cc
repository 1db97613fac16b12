// Test helper: locks GPU 0's SM clock through the NVML layer ($KAREUS_NVML_LIBRARY points at the
// fake), prints "locked <pid>" and then leaves in the way MODE names, so the test can check that
// the reset happens on that path:
//   return  the guard goes out of scope and main returns
//   exit    the guard is leaked and std::exit(0) runs the atexit hook
//   throw   an exception unwinds through the guard
//   sleep   waits (up to 60 s) for a signal or the parent's death
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kareus/nvml.h"

namespace {

void announce() {
  std::printf("locked %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: nvml_lock_helper return|exit|throw|sleep FREQ_MHZ\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int freq_mhz = std::atoi(argv[2]);
  namespace nvml = kareus::nvml;
  try {
    if (mode == "return") {
      auto lib = nvml::open({nvml::Access::kClockControl, ""});
      nvml::ClockGuard guard(*lib);
      guard.lock(0, freq_mhz);
      announce();
      return 0;
    }
    if (mode == "throw") {
      auto lib = nvml::open({nvml::Access::kClockControl, ""});
      try {
        nvml::ClockGuard guard(*lib);
        guard.lock(0, freq_mhz);
        announce();
        throw std::runtime_error("planned failure");
      } catch (const std::runtime_error&) {
        std::printf("caught\n");
      }
      return 0;
    }
    // Never destroyed, so only the process-wide safety net may reset the clock; held by statics
    // so a leak checker does not count them.
    static nvml::Nvml* lib = nvml::open({nvml::Access::kClockControl, ""}).release();
    static auto* guard = new nvml::ClockGuard(*lib);
    guard->lock(0, freq_mhz);
    announce();
    if (mode == "exit") std::exit(0);
    if (mode == "sleep") {
      for (int i = 0; i < 600; ++i) usleep(100000);
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvml_lock_helper: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "nvml_lock_helper: unknown mode %s\n", mode.c_str());
  return 2;
}
