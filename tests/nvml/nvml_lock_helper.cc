// Test helper: locks GPU 0's SM clock through the NVML layer ($KAREUS_NVML_LIBRARY points at the
// fake), prints "locked <pid>" and then leaves in the way MODE names, so the test can check that
// the reset happens on that path:
//   return  the guard goes out of scope and main returns
//   exit    the guard is leaked and std::exit(0) runs the atexit hook
//   throw   an exception unwinds through the guard
//   sleep   waits (up to 60 s) for a signal
//   sleep-pdeath  the same, with Options::reset_on_parent_death (reset when the parent dies)
//   relock-after-signal  SIGHUP's handler is a no-op of the host's: the layer's handler resets
//           the clock and the process lives on; locking the same clock again must reach NVML
//           (prints "relocked"), then main returns
// The announcement also carries the process's parent-death signal ("pdeathsig=N", 0: none), so a
// test can check that only the opt-in arms it.
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kareus/nvml.h"

namespace {

void announce() {
  int pdeathsig = -1;
  prctl(PR_GET_PDEATHSIG, &pdeathsig);
  std::printf("locked %d pdeathsig=%d\n", static_cast<int>(getpid()), pdeathsig);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: nvml_lock_helper return|exit|throw|sleep|sleep-pdeath FREQ_MHZ\n");
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
    if (mode == "relock-after-signal") {
      signal(SIGHUP, [](int) {});
      auto lib = nvml::open({nvml::Access::kClockControl, ""});
      nvml::ClockGuard guard(*lib);
      guard.lock(0, freq_mhz);
      announce();
      raise(SIGHUP);
      guard.lock(0, freq_mhz);
      std::printf("relocked\n");
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
    static nvml::Nvml* lib =
        nvml::open({nvml::Access::kClockControl, "", mode == "sleep-pdeath"}).release();
    static auto* guard = new nvml::ClockGuard(*lib);
    guard->lock(0, freq_mhz);
    announce();
    if (mode == "exit") std::exit(0);
    if (mode == "sleep" || mode == "sleep-pdeath") {
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
