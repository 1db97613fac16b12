// The device check (scripts/device-check): the four partitions of a TP workload measured on ONE
// GPU at its current clock through the protocol with short windows, the collective replaced by
// its copy proxy, next to the emulator's prediction for that card; then one mixture-of-experts
// partition (grouped expert GEMMs, the all-to-all as a copy proxy); optionally a sweep of every
// GEMM and attention shape of a list of workloads, each kernel alone. NVML is opened read-only, so
// no card setting can change (every setter throws before reaching NVML).
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "op_plan.h"

namespace kareus::cuda {

struct DeviceCheckOptions {
  std::string workload;   ///< YAML file; its partitions are measured at full per-GPU shape
  int device = 0;         ///< CUDA device index
  double window_s = 1.0;  ///< protocol window (short: this is a check, not a profile)
  double cooldown_s = 1.0;
  /// Rounds over all (partition, SMs) points, interleaved so that drift (temperature, clock)
  /// spreads over every point alike; more than one adds a repeatability table (mean and
  /// coefficient of variation per point): the run-to-run noise that search has to live with.
  int repeats = 1;
  /// SM counts given to the collective's proxy; empty: NCCL's default CTA count per partition.
  std::vector<int> sms;
  /// A mixture-of-experts workload: after the partitions, one of its grouped-GEMM partitions
  /// with the all-to-all as the copy proxy (one GPU), at NCCL's default CTAs and on the copy
  /// engines (0 SMs); empty: none.
  std::string moe_workload;
  /// Workloads whose GEMM and attention shapes (partitions and segments, deduplicated) are each
  /// timed alone on the whole GPU, with the SM clock sampled during the timing: the per-kernel
  /// efficiencies the emulator's Hopper entries are fitted on ("kernels" in the JSON); empty:
  /// no sweep.
  std::vector<std::string> kernel_workloads;
};

/// The kernel sweep's shapes for the workload files (KernelShapeSet, op_plan.h): what a sweep
/// would time, listed without a device. Throws InvalidInput naming a bad file.
std::vector<KernelShape> kernel_sweep_shapes(const std::vector<std::string>& workloads);

/// Measures, prints a table to `table` and returns the same rows as JSON. Throws NotSupported
/// without a device or NVML.
nlohmann::json run_device_check(const DeviceCheckOptions& o, std::ostream& table);

}  // namespace kareus::cuda
