// Test helpers around the fake NVML library: a clean fake environment per test, the fake's call
// log, and child processes with bounded waits (no test may hang on a child that misbehaves).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace kareus::test {

/// Points NVML at the fake, with a fresh call log; clears every other KAREUS_FAKE_NVML_* knob.
class FakeNvmlEnv {
 public:
  explicit FakeNvmlEnv(const char* library = KAREUS_FAKE_NVML) : library_(library) {
    for (const char* name :
         {"KAREUS_FAKE_NVML_DEVICES", "KAREUS_FAKE_NVML_NAME", "KAREUS_FAKE_NVML_POWER_W",
          "KAREUS_FAKE_NVML_ENERGY_MJ", "KAREUS_FAKE_NVML_TEMP_C", "KAREUS_FAKE_NVML_SM_CLOCK_MHZ",
          "KAREUS_FAKE_NVML_MAX_CLOCK_MHZ", "KAREUS_FAKE_NVML_REASONS", "KAREUS_FAKE_NVML_DENY",
          "KAREUS_FAKE_NVML_FAIL", "KAREUS_FAKE_NVML_REJECT_MHZ",
          "KAREUS_FAKE_NVML_LOCK_DELAY_MS"}) {
      unsetenv(name);
    }
    log_ = dir_.file("nvml-calls.log");
    setenv("KAREUS_FAKE_NVML_LOG", log_.c_str(), 1);
    setenv("KAREUS_NVML_LIBRARY", library_.c_str(), 1);
  }
  ~FakeNvmlEnv() {
    unsetenv("KAREUS_FAKE_NVML_LOG");
    unsetenv("KAREUS_NVML_LIBRARY");
  }
  void set(const char* name, const std::string& value) const { setenv(name, value.c_str(), 1); }
  const std::string& library() const { return library_; }
  const std::string& log_path() const { return log_; }
  const TempDir& dir() const { return dir_; }

  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(read_file(log_));
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  /// Lines that contain every one of `parts`.
  std::vector<std::string> grep(std::initializer_list<std::string> parts) const {
    std::vector<std::string> out;
    for (const auto& line : lines()) {
      bool all = true;
      for (const auto& p : parts) all = all && line.find(p) != std::string::npos;
      if (all) out.push_back(line);
    }
    return out;
  }
  /// Index of the first line (at or after `from`) holding every part, or -1.
  int find(std::initializer_list<std::string> parts, int from = 0) const {
    if (from < 0) return -1;  // chained after a failed find
    const auto all = lines();
    for (int i = from; i < static_cast<int>(all.size()); ++i) {
      bool ok = true;
      for (const auto& p : parts) ok = ok && all[i].find(p) != std::string::npos;
      if (ok) return i;
    }
    return -1;
  }

 private:
  TempDir dir_;
  std::string library_;
  std::string log_;
};

/// Polls `done` until it holds or `timeout_s` passes.
template <typename Pred>
bool wait_until(Pred done, double timeout_s = 15) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

/// Waits for `pid` (a child, or an orphan adopted by this subreaper); SIGKILLs it on timeout.
inline std::optional<int> wait_child(pid_t pid, double timeout_s = 15) {
  int status = 0;
  pid_t r = 0;
  wait_until([&] { return (r = waitpid(pid, &status, WNOHANG)) != 0; }, timeout_s);
  if (r == pid) return status;
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return std::nullopt;
}

/// A child process whose stdout is a pipe to us; killed and reaped on destruction if still there.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults, empty;
    sigemptyset(&empty);
    sigemptyset(&defaults);
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    out_ = out[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    if (out_ >= 0) close(out_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  /// One line of the child's stdout (without the newline), or nullopt on EOF/timeout.
  std::optional<std::string> read_line(double timeout_s = 15) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p = {out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }
  std::optional<int> wait(double timeout_s = 15) {
    auto status = wait_child(pid_, timeout_s);
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

/// Makes this process the reaper of orphaned descendants for its lifetime, so a test can wait
/// for a grandchild whose parent it killed.
class SubreaperScope {
 public:
  SubreaperScope() { ok_ = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }
  ~SubreaperScope() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

}  // namespace kareus::test
