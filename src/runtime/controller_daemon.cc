// The frequency controller process (kareus-freqd): owns one GPU's SM clock for a training
// process, after Perseus's asynchronous controller (Chung et al., SOSP '24). It reads target
// clocks from its input, locks the clock only when the target differs from the current lock
// (nvmlDeviceSetGpuLockedClocks(f, f); 0 resets), and resets on every way out: end-of-file (the
// client stopped or died), SIGTERM/SIGINT/SIGHUP, and the parent's death. Signals are blocked
// and read from a signalfd, so the reset and the final log line happen in normal context; the
// NVML layer's own signal handlers remain as a backstop.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "kareus/error.h"
#include "kareus/nvml.h"
#include "kareus/runtime.h"

namespace kareus::runtime {
namespace {

void write_all(int fd, const std::string& text) {
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

double now_epoch_s() {
  const auto t = std::chrono::system_clock::now().time_since_epoch();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(t).count()) /
         1e6;
}

class TransitionLog {
 public:
  TransitionLog(const std::string& path, int gpu) : gpu_(gpu) {
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw InvalidInput(
          fmt::format("--log {}: cannot open for writing: {}", path, std::strerror(errno)));
    }
  }
  ~TransitionLog() {
    if (fd_ >= 0) close(fd_);
  }
  TransitionLog(const TransitionLog&) = delete;
  TransitionLog& operator=(const TransitionLog&) = delete;

  // One write() per line, so a kill at any moment leaves only whole lines.
  void event(const char* kind, int freq_mhz, const char* reason = nullptr,
             const std::string& message = {}) {
    if (fd_ < 0) return;
    std::string line = fmt::format(R"({{"t_s": {:.6f}, "gpu": {}, "freq_mhz": {}, "event": "{}")",
                                   now_epoch_s(), gpu_, freq_mhz, kind);
    if (reason != nullptr) line += fmt::format(R"(, "reason": "{}")", reason);
    if (!message.empty()) line += R"(, "message": )" + nlohmann::json(message).dump();
    line += "}\n";
    write_all(fd_, line);
  }

 private:
  int gpu_;
  int fd_ = -1;
};

// NVML's index of the GPU the options name (UUID, PCI bus id or index); validates it.
int resolve_gpu(const ControllerDaemonOptions& o, nvml::Nvml& lib) {
  if (!o.gpu_uuid.empty()) return lib.device_by_uuid(o.gpu_uuid).index();
  if (!o.pci_bus_id.empty()) return lib.device_by_pci_bus_id(o.pci_bus_id).index();
  return lib.device(o.gpu_index).index();
}

// What touches the clock: NVML through a ClockGuard, or nothing in a dry run.
class Actuator {
 public:
  explicit Actuator(const ControllerDaemonOptions& o) : gpu_(o.gpu_index) {
    const bool by_identity = !o.gpu_uuid.empty() || !o.pci_bus_id.empty();
    if (o.dry_run) {
      // A dry run touches no clock, but a UUID or bus id still has to name a real GPU.
      if (by_identity)
        gpu_ = resolve_gpu(o, *nvml::open({nvml::Access::kReadOnly, o.nvml_library}));
      return;
    }
    // This process exists only to own the clock, so it opts into the parent-death reset.
    nvml_ = nvml::open({nvml::Access::kClockControl, o.nvml_library, true});
    gpu_ = resolve_gpu(o, *nvml_);  // before the controller reports ready
    guard_ = std::make_unique<nvml::ClockGuard>(*nvml_);
  }
  int gpu() const { return gpu_; }
  ~Actuator() {
    guard_.reset();  // resets before NVML shuts down
    nvml_.reset();
  }
  Actuator(const Actuator&) = delete;
  Actuator& operator=(const Actuator&) = delete;

  void apply(int freq_mhz) {
    if (!guard_) return;
    if (freq_mhz == 0) {
      guard_->reset(gpu_);
    } else {
      guard_->lock(gpu_, freq_mhz);
    }
  }

 private:
  int gpu_;
  std::unique_ptr<nvml::Nvml> nvml_;
  std::unique_ptr<nvml::ClockGuard> guard_;
};

class Controller {
 public:
  Controller(TransitionLog& log, Actuator& actuator) : log_(log), actuator_(actuator) {}

  void apply(int target_mhz) {
    if (target_mhz < 0) {
      std::fprintf(stderr, "kareus-freqd: gpu %d: ignoring invalid target %d MHz\n",
                   actuator_.gpu(), target_mhz);
      return;
    }
    if (target_mhz == current_mhz_) return;
    try {
      actuator_.apply(target_mhz);
    } catch (const Error& e) {
      // The training job goes on at whatever clock the GPU has; say so once per kind of failure.
      const std::string what = e.what();
      log_.event("error", target_mhz, nullptr, what);
      if (reported_.insert(what).second) {
        std::fprintf(stderr, "kareus-freqd: gpu %d: %s\n", actuator_.gpu(), what.c_str());
      }
      return;
    }
    current_mhz_ = target_mhz;
    if (target_mhz == 0) {
      log_.event("reset", 0, "request");
    } else {
      log_.event("lock", target_mhz);
    }
  }

  void finish(const char* reason) {
    if (current_mhz_ != 0) {
      try {
        actuator_.apply(0);
      } catch (const Error& e) {
        log_.event("error", 0, nullptr, e.what());
        std::fprintf(stderr, "kareus-freqd: gpu %d: %s\n", actuator_.gpu(), e.what());
      }
    }
    current_mhz_ = 0;
    log_.event("reset", 0, reason);
  }

 private:
  TransitionLog& log_;
  Actuator& actuator_;
  int current_mhz_ = 0;  // 0: default clocks (what the GPU has when the controller starts)
  std::set<std::string> reported_;
};

// What the daemon holds once started: the log, the actuator and the signalfd.
struct Started {
  std::unique_ptr<TransitionLog> log;
  std::unique_ptr<Actuator> actuator;
  int sfd = -1;
};

// Checks the options and opens the GPU, the log and the signalfd; reports "R" (ready) or "E" and
// the error on the ready pipe, so the client's start() returns only once clocks can be set.
Started start_daemon(const ControllerDaemonOptions& o, const sigset_t& mask) {
  Started st;
  try {
    if (o.gpu_index < 0) {
      throw InvalidInput(fmt::format("--gpu must be >= 0, got {}", o.gpu_index));
    }
    if (!o.gpu_uuid.empty() && !o.pci_bus_id.empty()) {
      throw InvalidInput(
          fmt::format("--gpu-uuid {} and --pci-bus-id {}: give one of them, not both", o.gpu_uuid,
                      o.pci_bus_id));
    }
    if (o.dry_run && o.log_path.empty()) {
      throw InvalidInput("--dry-run needs --log FILE (the log is the only output of a dry run)");
    }
    st.actuator = std::make_unique<Actuator>(o);
    st.log = std::make_unique<TransitionLog>(o.log_path, st.actuator->gpu());
    st.sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (st.sfd < 0) throw Error(fmt::format("signalfd: {}", std::strerror(errno)));
  } catch (const std::exception& e) {
    if (o.ready_fd >= 0) {
      write_all(o.ready_fd, std::string("E") + e.what());
      close(o.ready_fd);
    }
    throw;
  }
  if (o.ready_fd >= 0) {
    write_all(o.ready_fd, "R");
    close(o.ready_fd);
  }
  return st;
}

// The input loop: targets arrive as records on a socket, but a byte stream (a pipe, a file)
// works the same. End-of-file on the client's socket means "stop": queued targets are dropped. A
// pipe or a file is a script (a manual run), applied in full.
class InputLoop {
 public:
  InputLoop(const ControllerDaemonOptions& o, int sfd) : o_(o), sfd_(sfd) {
    struct stat input_stat = {};
    drop_at_eof_ = fstat(o.input_fd, &input_stat) == 0 && S_ISSOCK(input_stat.st_mode);
    // Non-blocking, so one readiness report can be drained completely (read_targets).
    fcntl(o.input_fd, F_SETFL, fcntl(o.input_fd, F_GETFL) | O_NONBLOCK);
  }

  // Applies targets until a signal, end of input or an error; returns the exit code and leaves
  // the reason for the final reset in reason().
  int run(Controller& controller) {
    for (;;) {
      pollfd fds[2] = {{o_.input_fd, POLLIN, 0}, {sfd_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        reason_ = "error";
        return 1;
      }
      if ((fds[1].revents & POLLIN) != 0 && take_signal()) break;
      if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      bool eof = false;
      std::vector<int> targets = read_targets(&eof);
      // The client is gone or stopping: what it queued no longer matters, only the reset does.
      if (eof && drop_at_eof_) break;
      if (o_.coalesce && targets.size() > 1) targets.erase(targets.begin(), targets.end() - 1);
      bool stop = false;
      for (std::size_t i = 0; i < targets.size() && !stop; ++i) {
        stop = i > 0 && should_stop(&eof);
        if (!stop) controller.apply(targets[i]);
      }
      if (stop || eof) break;
    }
    return exit_code_;
  }

  const char* reason() const { return reason_; }

 private:
  // Reads a waiting signal; true (with reason and exit code set) when there was one.
  bool take_signal() {
    signalfd_siginfo info = {};
    if (read(sfd_, &info, sizeof info) != static_cast<ssize_t>(sizeof info)) return false;
    const bool parent_gone = o_.parent_pid > 0 && getppid() != o_.parent_pid;
    reason_ = parent_gone ? "parent_death" : "signal";
    exit_code_ = parent_gone ? 0 : 128 + static_cast<int>(info.ssi_signo);
    return true;
  }

  // Between two applies (each an NVML call of 10-20 ms on real drivers): a signal or a hung-up
  // client ends the loop at once, so the reset never waits behind a backlog of targets. A
  // SOCK_SEQPACKET peer that closed or shut down shows POLLHUP even with records still queued.
  bool should_stop(bool* eof) {
    pollfd fds[2] = {{o_.input_fd, 0, 0}, {sfd_, POLLIN, 0}};
    if (poll(fds, 2, 0) <= 0) return false;
    if ((fds[1].revents & POLLIN) != 0 && take_signal()) return true;
    if (drop_at_eof_ && (fds[0].revents & (POLLHUP | POLLERR)) != 0) {
      *eof = true;
      return true;
    }
    return false;
  }

  // Drains what is waiting (bounded, so signals are still seen under a flood) and returns the
  // whole records; a partial record waits for the rest.
  std::vector<int> read_targets(bool* eof) {
    for (int round = 0; round < 1024; ++round) {
      char buf[64 * kWireMessageBytes];
      const ssize_t n = read(o_.input_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {  // end-of-file (or a reset connection): the client is done
        *eof = true;
        break;
      }
      pending_.insert(pending_.end(), buf, buf + n);
    }
    const std::size_t whole = pending_.size() / kWireMessageBytes * kWireMessageBytes;
    std::vector<int> targets;
    for (std::size_t off = 0; off < whole; off += kWireMessageBytes) {
      std::int32_t target = 0;
      std::memcpy(&target, pending_.data() + off, kWireMessageBytes);
      targets.push_back(target);
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(whole));
    return targets;
  }

  const ControllerDaemonOptions& o_;
  int sfd_;
  bool drop_at_eof_ = false;
  std::vector<char> pending_;
  int exit_code_ = 0;
  const char* reason_ = "eof";
};

}  // namespace

int run_controller_daemon(const ControllerDaemonOptions& o) {
  // A client that dies must not kill us through SIGPIPE on the ready pipe before the reset.
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&mask, sig);
  // Blocked before the death signal is armed, so it lands in the signalfd, never kills us early.
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  const bool orphaned = o.parent_pid > 0 && getppid() != o.parent_pid;
  Started st = start_daemon(o, mask);
  InputLoop loop(o, st.sfd);
  Controller controller(*st.log, *st.actuator);
  if (orphaned) {
    controller.finish("parent_death");
    close(st.sfd);
    return 0;
  }
  const int exit_code = loop.run(controller);
  controller.finish(loop.reason());
  close(st.sfd);
  return exit_code;
}

}  // namespace kareus::runtime
