// The `cuda` profiling backend (internal header; callers use create_profiler("cuda", ...)). It
// measures a partition on the GPUs of its collective group with the group executor
// (executor.h) through the thermally stable protocol (include/kareus/protocol.h), reading energy,
// temperature, clocks and throttle reasons from NVML (include/kareus/nvml.h). docs/cuda.md
// explains how to run it on a cluster.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor.h"
#include "kareus/nvml.h"
#include "kareus/profiler.h"
#include "kareus/protocol.h"

namespace kareus::cuda {

/// Settings beyond ProfilerOptions, for the device check and tests of the backend.
/// --static-power's window must be at least this long (s): NVML's energy counter updates about
/// every 100 ms.
inline constexpr double kMinStaticPowerWindowS = 2.0;
/// Without clock control, a window whose clock (snapped to the catalogue grid) is more than this
/// many grid steps from fixed_freq_mhz() is an error; a closer one is stored with a warning.
inline constexpr int kMaxClockGridSteps = 2;

struct CudaOptions {
  bool proxy_collective = false;  ///< replace every collective by a copy on the same CTAs
  ProtocolOptions protocol;       ///< window_s and cooldown_s are taken from ProfilerOptions
  /// The device check's mode: a window whose clock left the start-up clock (a card that lowers
  /// its clock under its power cap does) is returned with its clock range instead of refused.
  /// Nothing is stored in this mode, so no point can be filed under the wrong clock.
  bool report_clock_drift = false;
};

class CudaProfiler : public Profiler {
 public:
  /// Throws NotSupported "no CUDA device visible" without a device, InvalidInput for bad
  /// --devices or a workload GPU that is not the card, NotSupported when NVML cannot load.
  CudaProfiler(const ProfilerOptions& o, CudaOptions c = {});
  ~CudaProfiler() override;

  std::string name() const override { return "cuda"; }
  std::string fingerprint() const override;
  const GpuSpec& gpu() const override { return gpu_; }
  /// The catalogue's figure; measure_static_power_w() measures it on the group.
  double static_power_w() const override { return gpu_.static_power_w; }
  /// Throws InvalidInput naming --window-s when the window is under kMinStaticPowerWindowS.
  double measure_static_power_w() override;
  /// Without clock control: the SM clock the card runs under load (observed once, snapped to
  /// the catalogue's clock grid); with it: none (every clock can be locked).
  std::optional<int> fixed_freq_mhz() const override;
  Measurement measure(const Partition& p, const PartitionConfig& c) override;
  Measurement measure_segment(const Segment& s, int freq_mhz) override;

  /// The protocol's full result of the last measurement (clock, temperatures, attempts).
  const ProtocolResult& last_result() const { return last_; }
  /// Whether the last measurement ran its collective as the copy proxy.
  bool last_was_proxy() const { return last_proxy_; }
  /// Host seconds to enqueue one iteration of the last measured plan, over `iterations`
  /// (GroupExecutor::host_enqueue_s); the plan stays prepared after a measurement.
  double last_host_enqueue_s(int iterations);
  const std::vector<DeviceInfo>& devices() const { return info_; }
  /// Raw observed loaded clock (MHz) before snapping; 0 until fixed_freq_mhz() ran.
  int observed_clock_mhz() const { return observed_raw_mhz_; }
  double nvml_temperature_c(int rank);

 private:
  GroupExecutor& executor_for(int ranks) const;
  /// "attention=cudnn-fused;cudnn=<version>" or "attention=fallback" (sdpa::attention_path()).
  std::string attention_field() const;
  std::vector<nvml::Device*> nvml_devices(int ranks) const;
  /// Runs the protocol; warns on stderr when the point ends unstable (it is kept).
  ProtocolResult measure_plan(const std::string& what, const ExecutionPlan& plan, int sms,
                              int freq_mhz);
  /// Without clock control: warns when the window's clock, snapped to the grid, is not
  /// fixed_freq_mhz() (the point is stored under the latter), throws InternalError beyond
  /// kMaxClockGridSteps.
  void check_observed_clock(const std::string& what, const ProtocolResult& r) const;

  ProfilerOptions opt_;
  CudaOptions copt_;
  GpuSpec gpu_;
  std::vector<int> devices_;
  std::vector<DeviceInfo> info_;
  std::unique_ptr<nvml::Nvml> nvml_;
  std::vector<int> nvml_index_;  ///< NVML index of each rank's device (matched by UUID)
  std::unique_ptr<nvml::ClockGuard> guard_;
  std::string driver_version_;
  mutable std::map<int, std::unique_ptr<GroupExecutor>> executors_;  ///< by rank count
  mutable std::optional<int> fixed_clock_;
  mutable int observed_raw_mhz_ = 0;
  ProtocolResult last_;
  bool last_proxy_ = false;
  int last_ranks_ = 0;  ///< executor_for() of the last measurement; 0 before one
};

}  // namespace kareus::cuda
