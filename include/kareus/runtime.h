// The runtime side of Kareus inside a training job: a frequency controller per GPU that applies
// a plan's clocks (Perseus's design, SOSP '24). The controller is its own process
// (`kareus-freqd`), started by the training process with an argument vector (never a shell); the
// training process only posts target clocks on a socket (non-blocking), so a clock change never
// blocks a training step. The controller applies a target only when it differs from the current
// one, resets the GPU's clocks on normal exit, on SIGTERM/SIGINT/SIGHUP and when its parent dies
// (PR_SET_PDEATHSIG). It runs in its own process group, so a terminal's Ctrl-C or hang-up does
// not end it behind the trainer's back (end-of-file, SIGTERM and parent death still do). In
// dry-run mode it logs every transition as a JSON line
// {"t_s": ..., "gpu": ..., "freq_mhz": ..., "event": "lock"|"reset"} instead of touching NVML
// (t_s: seconds since the Unix epoch, microsecond resolution, so logs of ranks can be merged;
// reset events also carry "reason": "request", "eof", "signal" or "parent_death"; a failed NVML
// call is logged as "event": "error" with a "message").
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "kareus/error.h"

namespace kareus::runtime {

struct ControllerOptions {
  /// Which GPU, in order of preference: gpu_uuid, else pci_bus_id, else gpu_index (at most one
  /// of the first two may be set). NVML's index order is its own: not CUDA's default order, and
  /// blind to CUDA_VISIBLE_DEVICES, so an index can name another rank's GPU. Prefer the UUID or
  /// the PCI bus id of the process's CUDA device (docs/runtime.md, "Which GPU").
  int gpu_index = 0;       ///< NVML device index
  std::string gpu_uuid;    ///< e.g. "GPU-8f3c2d1e-..." (nvidia-smi -L)
  std::string pci_bus_id;  ///< e.g. "00000000:3B:00.0" (nvidia-smi --query-gpu=pci.bus_id)
  bool dry_run = false;
  std::string log_path;      ///< JSON-lines log of transitions (required in dry-run; optional
                             ///< otherwise); appended to, one write() per line
  std::string executable;    ///< path of kareus-freqd; empty: $KAREUS_FREQD, else next to the
                             ///< calling binary (or the shared object holding this code), else
                             ///< "kareus-freqd" on PATH
  std::string nvml_library;  ///< passed through to the controller (tests use a fake NVML)
  /// Apply only the newest of the targets that are waiting when the controller reads (useful
  /// when instructions are shorter than a clock switch); off: every target in order.
  bool coalesce = false;
  double ready_timeout_s = 10;  ///< start() gives up (and kills the process) after this long
};

/// Client handle of one controller process. Not copyable; destruction stops the controller,
/// which resets the clock before it exits.
///
/// Lifecycle: start() spawns kareus-freqd with an argument vector and returns once it reported
/// ready (NVML opened, handlers installed); set_clock() sends a target; stop() (or destruction)
/// shuts the channel down, the controller resets the clock and exits. If the training process
/// dies, the controller sees end-of-file and its parent-death signal and resets too. Call start()
/// from a thread that lives as long as the controller (e.g. the main thread): Linux delivers the
/// parent-death signal when the creating *thread* exits.
///
/// Thread-safety: set_clock() may be called from any thread; stop() must not race with it.
class FrequencyController {
 public:
  /// Starts the controller process and waits until it is ready. Throws InvalidInput for bad
  /// options or when the controller rejects them (its exit code 2, e.g. a GPU index NVML does not
  /// have), NotSupported when NVML is unavailable there (exit code 3), Error otherwise; the
  /// message carries the controller's own explanation.
  static std::unique_ptr<FrequencyController> start(const ControllerOptions& o);
  virtual ~FrequencyController() = default;
  /// Asks for `freq_mhz` (0: reset to default clocks; negative: InvalidInput). Never blocks on
  /// the controller: the send is non-blocking, and when the channel is full only the newest
  /// target is kept and delivered by a background thread as soon as there is room. Throws Error
  /// if the controller has exited.
  virtual void set_clock(int freq_mhz) = 0;
  /// Asks the controller to reset and exit (it drops targets still queued and resets at once),
  /// and waits for it: 5 s (dry run) or 10 s, then SIGTERM and another 2 s (dry run) or 30 s,
  /// since an NVML call can take tens of milliseconds and a SIGKILL would leave the clock locked;
  /// then SIGKILL. Idempotent. Throws Error if the controller did not exit cleanly. In a forked
  /// child of the process that called start() (a data-loader worker), stop() and destruction only
  /// close the child's copy of the channel: the controller belongs to the parent.
  virtual void stop() = 0;
  virtual pid_t pid() const = 0;
};

/// The wire protocol between client and controller: a connected AF_UNIX SOCK_SEQPACKET pair (no
/// filesystem name, so no permission to get wrong), the controller's end on its stdin. Each
/// message is one native-endian int32 target clock in MHz; 0 means "reset to default clocks".
/// Closing or shutting down the client's end is the request to reset and exit.
inline constexpr int kWireMessageBytes = 4;

/// The controller process (kareus-freqd's main calls this; exposed for tests).
struct ControllerDaemonOptions {
  int gpu_index = 0;
  std::string gpu_uuid;    ///< if set, selects the GPU (NVML's index is then looked up)
  std::string pci_bus_id;  ///< likewise; at most one of gpu_uuid and pci_bus_id
  bool dry_run = false;
  std::string log_path;
  std::string nvml_library;
  bool coalesce = false;
  int input_fd = 0;      ///< where targets arrive (kWireMessageBytes each)
  int ready_fd = -1;     ///< gets "R" once running, or "E<message>" on a start-up failure
  pid_t parent_pid = 0;  ///< expected parent; if getppid() differs at start, it already died
};

/// Runs the controller until end-of-file on input_fd, SIGTERM/SIGINT/SIGHUP, or the parent's
/// death (PR_SET_PDEATHSIG(SIGTERM)), then resets the clock. Targets still queued at end-of-file
/// are dropped, and signals are checked between two NVML calls, so the way out never waits for a
/// backlog of clock changes. Returns the process exit code: 0 on
/// end-of-file or parent death, 128 + signal number on a signal. Throws (after reporting on
/// ready_fd) when it cannot start: InvalidInput for bad options, nvml errors for NVML.
int run_controller_daemon(const ControllerDaemonOptions& o);

}  // namespace kareus::runtime
