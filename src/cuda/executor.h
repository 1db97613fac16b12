// Runs an ExecutionPlan (op_plan.h) on the GPUs of one collective group from one process: one
// rank per GPU, each with a compute stream and a collective stream. Compute ops go to the
// compute stream in order; the overlapping collective goes to the collective stream, which
// waits on an event recorded on the compute stream right before op `slot_index` (the launch
// slot), and the compute stream waits for the collective at the end of every iteration, so an
// iteration ends when both streams are done. Collectives run with NCCL on communicators whose
// CTA count is fixed (ncclConfig_t.minCTAs = maxCTAs = sms), cached per CTA count; with one
// rank, or when asked, they are replaced by a copy of the same payload on `sms` CTAs (the
// proxy). Not thread-safe; one executor per group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "op_plan.h"

namespace kareus::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;  ///< e.g. "NVIDIA H200"
  std::string uuid;  ///< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML reports it
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::size_t memory_bytes = 0;
};

/// Devices the CUDA runtime sees. Throws NotSupported "no CUDA device visible (...)" when there
/// are none or the driver is missing; never hangs.
int visible_device_count();
DeviceInfo device_info(int index);
int cuda_runtime_version();
int cuda_driver_version();

class GroupExecutor {
 public:
  /// `devices`: CUDA device index of rank r at position r.
  explicit GroupExecutor(std::vector<int> devices);
  ~GroupExecutor();
  GroupExecutor(const GroupExecutor&) = delete;
  GroupExecutor& operator=(const GroupExecutor&) = delete;

  int ranks() const;
  const std::vector<int>& devices() const;

  /// Allocates (or reuses) and fills the buffers of `plan` on every rank and builds its GEMM
  /// plans; collectives will use `sms` CTAs; `proxy` replaces them with copies. The plan's group
  /// must equal ranks() unless `proxy` is set. Synchronous.
  void prepare(const ExecutionPlan& plan, int sms, bool proxy);
  /// Runs the prepared plan `iterations` times back to back; returns their elapsed device time
  /// in seconds, the maximum over ranks (CUDA events on each rank's compute stream).
  double run(int iterations);
  /// Host seconds to enqueue one iteration of the prepared plan: `iterations` are enqueued onto
  /// idle GPUs, few enough that the launch queue never fills (so the host never waits on the
  /// GPU), timed by the host clock; then waits for them. Where it exceeds run()'s device time
  /// per iteration, the host sets the pace of back-to-back iterations.
  double host_enqueue_s(int iterations);

  /// How attention runs: "cudnn-fused" (cuDNN's fused flash attention, cudnn_sdpa.h) until a
  /// step of it fails in this process, "fallback kernel" from then on (sdpa::attention_path()).
  std::string attention_backend() const;
  /// "nccl" or "proxy copy" for the prepared plan.
  bool proxy() const;

  /// Keeps every SM of rank 0 busy for about `seconds` (asynchronous; see wait()).
  void start_busy(double seconds);
  /// Blocks the group in a receive: ranks 1..n-1 in an NCCL receive from rank 0 whose send is
  /// not posted yet; with one rank, one CTA spinning on a host flag. end_blocked_receive()
  /// posts the send (or sets the flag) and waits.
  void begin_blocked_receive();
  void end_blocked_receive();
  /// The ranks that begin_blocked_receive() blocks (1..n-1, or {0} with one rank).
  std::vector<int> blocked_ranks() const;
  void wait();  ///< synchronises every rank

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kareus::cuda
