// Client side of the per-GPU frequency controller. The design follows Perseus (Chung et al.,
// "Perseus: Reducing Energy Bloat in Large Model Training", SOSP '24): the training process never
// waits for a clock change; it posts the target and moves on, and a separate process owns the GPU
// clock. A clock change through NVML takes 10-20 ms, longer than some pipeline instructions, so a
// blocking call in the training step would cost more than the energy it saves.
//
// Transport: a SOCK_SEQPACKET socketpair instead of a pipe. Each target is one record, so a
// non-blocking send either delivers all four bytes or none; MSG_NOSIGNAL turns a dead controller
// into EPIPE instead of a SIGPIPE that would kill the training process; shutdown() reaches the
// controller even when forked workers (data loaders) hold copies of the descriptor.
#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "kareus/error.h"
#include "kareus/runtime.h"

extern char** environ;

namespace kareus::runtime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kExecutableName = "kareus-freqd";
constexpr int kChildReadyFd = 3;

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

bool is_executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

// Returns {path, search_path}: search_path means "let posix_spawnp look it up in PATH".
std::pair<std::string, bool> find_executable(const ControllerOptions& o) {
  if (!o.executable.empty()) {
    if (!is_executable(o.executable)) {
      throw InvalidInput(
          fmt::format("ControllerOptions.executable: '{}' is not an executable "
                      "file",
                      o.executable));
    }
    return {o.executable, false};
  }
  if (const char* env = std::getenv("KAREUS_FREQD"); env != nullptr && *env != '\0') {
    if (!is_executable(env)) {
      throw InvalidInput(fmt::format("$KAREUS_FREQD: '{}' is not an executable file", env));
    }
    return {env, false};
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && is_executable(self.parent_path() / kExecutableName)) {
    return {(self.parent_path() / kExecutableName).string(), false};
  }
  // When this code lives in a shared object (the Python module), look next to it and in the
  // build tree's bin/ beside it.
  Dl_info info = {};
  if (dladdr(reinterpret_cast<void*>(&find_executable), &info) != 0 && info.dli_fname != nullptr) {
    const fs::path dir = fs::absolute(info.dli_fname, ec).parent_path();
    for (const fs::path& candidate : {dir / kExecutableName, dir / "bin" / kExecutableName,
                                      dir.parent_path() / "bin" / kExecutableName}) {
      if (is_executable(candidate)) return {candidate.string(), false};
    }
  }
  return {kExecutableName, true};
}

class ControllerImpl : public FrequencyController {
 public:
  ControllerImpl(pid_t pid, int fd, bool dry_run)
      : pid_(pid), owner_pid_(getpid()), dry_run_(dry_run), fd_(fd) {}

  ~ControllerImpl() override {
    try {
      stop();
    } catch (const std::exception&) {
      // stop() already killed and reaped the process; a destructor has no one to tell.
    }
  }

  void set_clock(int freq_mhz) override {
    if (freq_mhz < 0) {
      throw InvalidInput(
          fmt::format("set_clock: freq_mhz must be >= 0 (0 resets), got {}", freq_mhz));
    }
    std::unique_lock lock(mu_);
    if (error_) throw Error(*error_);
    if (fd_ < 0) throw Error("set_clock: the frequency controller was stopped");
    pending_.reset();  // the newest target supersedes one still waiting for room
    const int err = send_target(freq_mhz);
    if (err == 0) return;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      pending_ = freq_mhz;
      if (!flusher_) flusher_ = std::make_unique<std::thread>([this] { flush_loop(); });
      cv_.notify_one();
      return;
    }
    error_ = describe_send_error(err);
    throw Error(*error_);
  }

  void stop() override {
    if (getpid() != owner_pid_) {
      // A forked child (a data-loader worker) holds a copy of this object: the controller is the
      // parent's, so the child only drops its descriptor. No shutdown() (it would end the
      // parent's channel), no signal, no wait; the flusher thread does not exist here, so its
      // handle is leaked rather than joined.
      if (stopped_) return;
      stopped_ = true;
      if (fd_ >= 0) close(std::exchange(fd_, -1));
      (void)flusher_.release();
      return;
    }
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      stopping_ = true;
    }
    cv_.notify_all();
    if (flusher_ && flusher_->joinable()) flusher_->join();
    {
      std::lock_guard lock(mu_);
      if (fd_ >= 0) {
        shutdown(fd_, SHUT_RDWR);
        close(fd_);
        fd_ = -1;
      }
    }
    const std::optional<int> status = reap();
    if (!status) return;  // reaped elsewhere (a SIGCHLD handler of the host)
    if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return;
    throw Error(fmt::format("kareus-freqd (pid {}) did not exit cleanly: {}", pid_,
                            WIFEXITED(*status)
                                ? fmt::format("exit code {}", WEXITSTATUS(*status))
                                : fmt::format("killed by signal {}", WTERMSIG(*status))));
  }

  pid_t pid() const override { return pid_; }

 private:
  // Returns 0 or the errno of a non-blocking send of one target. Called with mu_ held.
  int send_target(int freq_mhz) {
    const std::int32_t message = freq_mhz;
    static_assert(sizeof message == kWireMessageBytes);
    for (;;) {
      const ssize_t n = send(fd_, &message, sizeof message, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n == static_cast<ssize_t>(sizeof message)) return 0;
      if (n < 0 && errno == EINTR) continue;
      return n < 0 ? errno : EIO;
    }
  }

  std::string describe_send_error(int err) const {
    return fmt::format(
        "set_clock: kareus-freqd (pid {}) is gone ({}); the GPU's clocks are back "
        "at their defaults",
        pid_, std::strerror(err));
  }

  // Delivers the newest pending target once the controller has drained some of the queue.
  void flush_loop() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      cv_.wait(lock, [this] { return stopping_ || pending_.has_value(); });
      if (stopping_) break;
      pollfd p = {fd_, POLLOUT, 0};
      lock.unlock();
      poll(&p, 1, 20);  // a timeout, not only POLLOUT, drives the retry
      lock.lock();
      if (stopping_ || !pending_) continue;
      const int err = send_target(*pending_);
      if (err == 0) {
        pending_.reset();
      } else if (err != EAGAIN && err != EWOULDBLOCK) {
        pending_.reset();
        error_ = describe_send_error(err);
      }
    }
  }

  // Waits for the controller after end-of-file, then SIGTERM, then SIGKILL. A SIGKILL leaves a
  // locked clock locked, so a controller that drives NVML (calls of 10-20 ms, longer on a busy
  // driver) gets far longer than a dry run before it.
  std::optional<int> reap() {
    const std::pair<int, double> steps[] = {
        {0, dry_run_ ? 5.0 : 10.0}, {SIGTERM, dry_run_ ? 2.0 : 30.0}, {SIGKILL, 5.0}};
    for (const auto& [sig, wait_s] : steps) {
      if (sig != 0) kill(pid_, sig);
      const auto deadline = Clock::now() + std::chrono::duration<double>(wait_s);
      while (Clock::now() < deadline) {
        int status = 0;
        const pid_t r = waitpid(pid_, &status, WNOHANG);
        if (r == pid_) return status;
        if (r < 0 && errno != EINTR) return std::nullopt;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    return std::nullopt;
  }

  const pid_t pid_;
  const pid_t owner_pid_;  // the process that started the controller (see stop())
  const bool dry_run_;
  std::mutex mu_;
  std::condition_variable cv_;
  int fd_;
  std::optional<int> pending_;
  std::optional<std::string> error_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::unique_ptr<std::thread> flusher_;  // a pointer, so a forked child can leak it
};

// Reads the controller's start-up report: "R" when ready, "E<message>" or end-of-file on failure.
std::string wait_ready(int fd, pid_t pid, double timeout_s, bool* ready) {
  std::string text;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      *ready = false;
      return fmt::format("kareus-freqd (pid {}) did not report ready within {} s", pid, timeout_s);
    }
    pollfd p = {fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *ready = false;
      return fmt::format("waiting for kareus-freqd (pid {}) to report ready: poll: {}", pid,
                         std::strerror(errno));
    }
    if (r == 0) continue;
    char buf[512];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text == "R") {
      *ready = true;
      return {};
    }
  }
  *ready = false;
  if (!text.empty() && text[0] == 'E') return text.substr(1);
  return fmt::format("kareus-freqd (pid {}) exited before it was ready", pid);
}

void check_options(const ControllerOptions& o) {
  if (o.gpu_index < 0) {
    throw InvalidInput(
        fmt::format("ControllerOptions.gpu_index must be >= 0, got {}", o.gpu_index));
  }
  if (o.dry_run && o.log_path.empty()) {
    throw InvalidInput(
        "ControllerOptions.log_path is required with dry_run (the log is the only "
        "output of a dry run)");
  }
  if (!o.gpu_uuid.empty() && !o.pci_bus_id.empty()) {
    throw InvalidInput(fmt::format(
        "ControllerOptions: gpu_uuid '{}' and pci_bus_id '{}' are both set; give one of them",
        o.gpu_uuid, o.pci_bus_id));
  }
}

// The controller's command line (tools/kareus-freqd/main.cc).
std::vector<std::string> controller_args(const ControllerOptions& o, const std::string& exe) {
  std::vector<std::string> args = {exe,
                                   "--gpu",
                                   std::to_string(o.gpu_index),
                                   "--ready-fd",
                                   std::to_string(kChildReadyFd),
                                   "--parent-pid",
                                   std::to_string(getpid())};
  if (!o.gpu_uuid.empty()) args.insert(args.end(), {"--gpu-uuid", o.gpu_uuid});
  if (!o.pci_bus_id.empty()) args.insert(args.end(), {"--pci-bus-id", o.pci_bus_id});
  if (o.dry_run) args.push_back("--dry-run");
  if (o.coalesce) args.push_back("--coalesce");
  if (!o.log_path.empty()) args.insert(args.end(), {"--log", o.log_path});
  if (!o.nvml_library.empty()) args.insert(args.end(), {"--nvml-library", o.nvml_library});
  return args;
}

// Starts the controller with `child_in` as its stdin and `child_ready` as kChildReadyFd, nothing
// else open, signals at their defaults, in its own process group. Returns posix_spawn's error.
int spawn_controller(const std::string& exe, bool search_path, std::vector<std::string> args,
                     int child_in, int child_ready, pid_t* pid) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_in, 0);
  posix_spawn_file_actions_adddup2(&actions, child_ready, kChildReadyFd);
  posix_spawn_file_actions_addclosefrom_np(&actions, kChildReadyFd + 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The host may block or ignore signals (Python ignores SIGPIPE); the controller starts clean.
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // Its own process group: Ctrl-C or a hang-up in the trainer's terminal goes to the foreground
  // group and must not end the controller while the trainer, which may handle the signal, goes
  // on. End-of-file, SIGTERM and the parent-death signal still end it.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  const int rc = search_path ? posix_spawnp(pid, exe.c_str(), &actions, &attr, argv.data(), environ)
                             : posix_spawn(pid, exe.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc;
}

// A controller that did not report ready: reaps it (killing it after 2 s) and throws what it
// said, typed by its exit code (2: bad input, 3: not supported).
[[noreturn]] void fail_start(const ControllerOptions& o, pid_t pid, const std::string& failure) {
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  pid_t r = 0;
  while ((r = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (r == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  const std::string which = !o.gpu_uuid.empty()     ? o.gpu_uuid
                            : !o.pci_bus_id.empty() ? o.pci_bus_id
                                                    : std::to_string(o.gpu_index);
  const std::string message = fmt::format("frequency controller for GPU {}: {}", which, failure);
  if (r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 2) throw InvalidInput(message);
  if (r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 3) throw NotSupported(message);
  throw Error(message);
}

}  // namespace

std::unique_ptr<FrequencyController> FrequencyController::start(const ControllerOptions& o) {
  check_options(o);
  const auto [exe, search_path] = find_executable(o);

  // The parent's ends stay close-on-exec, so other children of the training process never hold
  // them; the child's ends are moved to fixed numbers by the spawn actions.
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw Error(fmt::format("socketpair for kareus-freqd: {}", std::strerror(errno)));
  }
  Fd ours(sv[0]), theirs(sv[1]);
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    throw Error(fmt::format("pipe for kareus-freqd: {}", std::strerror(errno)));
  }
  Fd ready_r(ready[0]), ready_w(ready[1]);
  // Above the numbers the child uses, so each dup2 really duplicates (and drops CLOEXEC).
  Fd child_in(fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
  Fd child_ready(fcntl(ready_w.get(), F_DUPFD_CLOEXEC, 10));
  theirs.reset();
  ready_w.reset();
  if (child_in.get() < 0 || child_ready.get() < 0) {
    throw Error(fmt::format("fcntl for kareus-freqd: {}", std::strerror(errno)));
  }
  pid_t pid = -1;
  const int rc = spawn_controller(exe, search_path, controller_args(o, exe), child_in.get(),
                                  child_ready.get(), &pid);
  child_in.reset();
  child_ready.reset();
  if (rc != 0) {
    throw Error(fmt::format("cannot start {}: {}{}", exe, std::strerror(rc),
                            search_path ? " (not found next to this program nor on PATH; set "
                                          "ControllerOptions.executable or $KAREUS_FREQD)"
                                        : ""));
  }
  bool is_ready = false;
  const std::string failure = wait_ready(ready_r.get(), pid, o.ready_timeout_s, &is_ready);
  if (is_ready) return std::make_unique<ControllerImpl>(pid, ours.release(), o.dry_run);
  ours.reset();  // end-of-file lets a slow starter exit by itself
  fail_start(o, pid, failure);
}

}  // namespace kareus::runtime
