// Fitting the emulator to measured whole-iteration figures (data/calibration). The fit
// changes only the parameters marked "fitted" in EmulatorParams, on one workload; every other
// workload is a prediction. docs/emulator.md records the procedure and the residuals.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kareus/artifact.h"
#include "kareus/emulator.h"
#include "kareus/partition.h"

namespace kareus {

struct CalibrationTarget {
  std::string label;     ///< e.g. "megatron@1410"
  std::string schedule;  ///< megatron, nanobatch or perseus-slowest (see read_calibration_targets)
  int freq_mhz = 0;      ///< uniform clock of megatron and nanobatch; 0 for perseus-slowest
  double time_s = 0;
  double energy_j = 0;  ///< per GPU, summed over stages, static included
};

/// Reads the calibration CSV (method,iter_time_s,energy_j) and maps its rows to targets: the
/// fastest perseus row is Megatron at the maximum clock, the fastest nanobatch_perseus row is
/// Nanobatching at the maximum clock, and the slowest perseus row is emulated as the procedure
/// that produced it: the slow end of a Perseus frontier, every pipeline instruction at the clock
/// of the Perseus range (the GPU's search clocks) where its own energy, static included, is
/// lowest (perseus_slowest_clocks), with Megatron's sequential kernels.
std::vector<CalibrationTarget> read_calibration_targets(const std::string& csv_path,
                                                        int max_freq_mhz);

/// The clock of every (stage, instruction kind) at the slow end of a Perseus frontier: the
/// clock of the GPU's search range (the Perseus range: A100 900-1410 MHz in 30 MHz steps)
/// minimizing the instruction's emulated energy (dynamic + static power x time) under Megatron's
/// sequential kernels. Key: stage * 2 + (backward ? 1 : 0).
std::vector<int> perseus_slowest_clocks(const Workload& w, const EmulatorModel& m);
/// The same for any schedule: per (stage, instruction kind), the clock of the GPU's search range
/// minimizing the instruction's energy (static included) when run in `mode` on `w`'s partitions
/// (kOverlapped: NCCL's default CTAs, collective at the partition start).
std::vector<int> min_energy_clocks(const Workload& w, const EmulatorModel& m, ExecutionMode mode);

struct Residual {
  CalibrationTarget target;
  double time_s = 0;
  double energy_j = 0;
  double time_error = 0;  ///< relative: predicted / measured - 1
  double energy_error = 0;
};

std::vector<Residual> evaluate_targets(const Workload& w, const EmulatorParams& p,
                                       const std::vector<CalibrationTarget>& targets);

// ---- Per-clock stage profiles (Perseus, Chung et al., SOSP '24; data/calibration/README.md).

/// One row of a Perseus stage profile: one pipeline stage's forward or backward of one
/// micro-batch on one GPU at one SM clock.
struct StageProfilePoint {
  int stage = 0;
  InstructionKind kind = InstructionKind::kForward;
  int freq_mhz = 0;
  double time_s = 0;
  double energy_j = 0;  ///< whole board, static included
};

/// Reads `stage,instruction,frequency,time,energy` rows. Throws InvalidInput naming the file, the
/// line and the field.
std::vector<StageProfilePoint> read_stage_profile(const std::string& csv_path);

/// The stage computation assumed for a Perseus profile: "gpt3-175b" or "bloom-176b" (8 stages,
/// TP 8, micro-batch 1, sequence 2048, no recomputation; docs/emulator.md gives each figure's
/// source). Throws InvalidInput for another name.
Workload perseus_stage_workload(const std::string& model);
/// The two profiled models, in the order `kareus calibrate` reports them.
std::vector<std::string> perseus_stage_models();

struct StageProfileRow {
  StageProfilePoint measured;
  double emulated_time_s = 0;
  double measured_power_w = 0;  ///< energy / time
  double emulated_power_w = 0;
  double measured_norm_time = 0;  ///< time / the same instruction's time at the top clock
  double emulated_norm_time = 0;
  double norm_time_error = 0;  ///< emulated_norm_time / measured_norm_time - 1
  double power_error = 0;      ///< emulated_power_w / measured_power_w - 1
};

struct StageProfileResult {
  std::string model;
  std::vector<StageProfileRow> rows;  ///< in file order
  double norm_time_rms = 0;           ///< RMS of norm_time_error over rows
  double power_rms = 0;               ///< RMS of power_error over rows
};

/// Emulates every row's instruction at its clock with Megatron's sequential schedule and
/// compares. `power_limit_w` is the profiled GPUs' board limit (their README: above 400 W).
StageProfileResult evaluate_stage_profile(const std::string& model,
                                          const std::vector<StageProfilePoint>& points,
                                          const EmulatorParams& p, double power_limit_w);

/// Mean compute slowdown over the partitions of `w` at the top clock when the collective runs
/// from the partition start with NCCL's default CTAs (Nanobatching): compute end with the
/// collective over compute time alone, minus 1, averaged over distinct partitions.
double mean_overlap_compute_slowdown(const Workload& w, const EmulatorParams& p);
/// The published mean slowdown of compute under a concurrent collective, 18.9% (Agrawal et al.,
/// "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning",
/// arXiv 2507.03114, 2025), that `overlap_slowdown` is set to reproduce.
constexpr double kPublishedOverlapSlowdown = 0.189;
/// overlap_slowdown in [0, 0.6] (bisection) at which mean_overlap_compute_slowdown(w) equals
/// `target`; 0 when the SM and HBM sharing alone already reach it.
double fit_overlap_slowdown(const Workload& w, EmulatorParams p, double target);

// ---- Partitions measured on a real GPU (`kareus profile --backend cuda`, data/device/).

/// One measured configuration against the emulator at the same configuration. The device ran
/// the collective as a local copy of its payload on the same CTAs (docs/cuda.md "Proxy"), and
/// so does the emulation.
struct DeviceRow {
  std::string workload, partition, slot, reasons;
  int sms = 0;
  int freq_mhz = 0;               ///< requested clock
  int measured_min_freq_mhz = 0;  ///< lowest sampled clock (power capping lowers it)
  int rounds = 1;                 ///< measurements averaged (repeatability runs)
  double measured_time_s = 0, measured_power_w = 0;
  double emulated_time_s = 0, emulated_power_w = 0;
  double time_error = 0;   ///< emulated / measured - 1
  double power_error = 0;  ///< emulated / measured - 1
};

/// Reads a device run (`partitions` rows with time_s, energy_j, sms, slot, clock fields, and the
/// `workload` path, resolved against `root` when relative), averages the rounds of each
/// (partition, slot, SMs) and emulates every configuration on the run's catalogue GPU with the
/// collective as the copy the device ran. Throws InvalidInput naming the file and field.
std::vector<DeviceRow> evaluate_device_run(const std::string& json_path, const std::string& root,
                                           const EmulatorParams& p);

/// A device run shipped in data/device/ (path relative to the source tree) and whether the
/// H100/H200 fit uses it (the others are held out, never fitted on).
struct DeviceRunFile {
  std::string path;
  bool fit = false;
};
/// The H200 runs: Llama 3.2 3B and Llama 3.3 70B partitions (2026-11-29 at 32 SMs, the
/// repeatability runs of 2026-11-30 at 6, 18 and 32 SMs) fit; every Qwen3 1.7B run (CP2 TP4,
/// TP8) is held out.
const std::vector<DeviceRunFile>& device_run_set();

struct DeviceFit {
  EmulatorParams params;  ///< `p` with the fitted fields replaced
  double rms = 0;         ///< root mean of the squared time and power errors over the rows
  int evaluations = 0;
};

/// sm_power_w and the three best-case kernel efficiencies (GEMM, attention forward and
/// backward) that minimize the mean squared time and power errors over every configuration of
/// the runs (pattern search from `p`'s values); the other fields of `p` are kept.
DeviceFit fit_device_params(const std::vector<std::string>& json_paths, const std::string& root,
                            const EmulatorParams& p);

// ---- The Kareus artifact's measured frontier ends (artifact.h; fit on five workloads, the
// other five held out, artifact_set).

/// The ends of one method's frontier: its fastest point's time and energy and its least energy
/// (one GPU per stage, summed over the stages, static included).
struct FrontierEnds {
  double fastest_time_s = 0;
  double energy_at_fastest_j = 0;
  double least_energy_j = 0;
};
/// One workload and method of the artifact: the measured ends and the workload they belong to.
struct ArtifactCase {
  std::string method;  ///< perseus or nanobatch_perseus
  bool fit = false;    ///< in the fit set (artifact_set)
  Workload workload;
  FrontierEnds measured;
};
struct ArtifactResidual {
  std::string workload, method;
  bool fit = false;
  FrontierEnds measured, emulated;
  /// emulated / measured - 1: fastest time, energy at fastest, least energy.
  double time_error = 0, energy_at_fastest_error = 0, least_energy_error = 0;
};
/// The Perseus and Nanobatching+Perseus frontiers of `measured` as cases, each workload read by
/// `load` (from its name). The Kareus frontier is left out: its ends need the searched plans.
std::vector<ArtifactCase> artifact_cases(const std::vector<ArtifactFrontier>& measured,
                                         const std::function<Workload(const std::string&)>& load);
/// A method's frontier ends as the planner's frontier reaches them without a search: the
/// fastest plan runs every instruction at the maximum clock (perseus: Megatron's sequential
/// kernels; nanobatch_perseus: two nano-batches, NCCL's defaults), the least-energy plan every
/// instruction at its own minimum-energy clock (min_energy_clocks). On the committed parameters
/// they are within 1% of `kareus calibrate --artifact-csv` (which plans each workload).
FrontierEnds emulate_frontier_ends(const Workload& w, const EmulatorModel& m,
                                   const std::string& method);
std::vector<ArtifactResidual> evaluate_artifact(const std::vector<ArtifactCase>& cases,
                                                const EmulatorParams& p);

struct CalibrationResult {
  EmulatorParams params;
  std::vector<std::string> fitted;  ///< names of the fitted parameters
  std::vector<Residual> residuals;
  double rms_error = 0;  ///< over all times and energies of the iteration targets
  int evaluations = 0;
  /// Stage-profile part of the fit (empty when calibrate() was given no profiles).
  double stage_power_limit_w = 0;            ///< fitted board limit of the profiled GPUs
  std::vector<StageProfileResult> fit_part;  ///< profiles the fit used
  std::vector<StageProfileResult> held_out;  ///< profiles it did not see
  /// Artifact frontier ends (empty when calibrate() was given no cases): fit and held-out rows.
  std::vector<ArtifactResidual> artifact;
};

/// Named stage profiles: model ("gpt3-175b") and its rows.
using StageProfiles = std::vector<std::pair<std::string, std::vector<StageProfilePoint>>>;

/// The starting point of the fit: the defaults with the fitted parameters reset to prior
/// guesses (achieved_fraction 0.8, sm_power_w 250 W, voltage_ratio 1.25, knee 1080 MHz,
/// idle_activity 0.3, nccl_sms_to_saturate 16; with artifact cases also launch_overhead_s 4 us,
/// cp_step_s 500 us, attn_kv_half 256 keys, partition_sync_s 10 us), so that the fit without the
/// artifact reproduces the committed defaults from scratch (with it, the refit of
/// docs/emulator.md). The search is local: another start can end elsewhere.
EmulatorParams calibration_prior();
/// The profiled GPUs' board limit (W) fitted by `kareus calibrate` (their README: above 400 W):
/// where the Perseus stage times flatten near the top clock.
constexpr double kPerseusStagePowerLimitW = 513.916;
/// Prior guess of the profiled GPUs' board limit (W).
constexpr double kStagePowerLimitPriorW = 450;

/// Deterministic coordinate search (multiplicative steps, halved when no step improves) that
/// minimizes the mean squared relative errors of every target's time and energy plus, when
/// `fit` is not empty, the mean squared errors of normalized time and of power over the fit
/// profiles, plus, when `artifact` is not empty, the mean squared errors of the fit cases'
/// frontier ends (then launch_overhead_s, cp_step_s, attn_kv_half and partition_sync_s are
/// searched too).
/// overlap_slowdown is not searched: it is set from the published figure
/// (fit_overlap_slowdown) after every accepted step. `held_out` profiles and held-out artifact
/// cases are only evaluated.
CalibrationResult calibrate(const Workload& w, const std::vector<CalibrationTarget>& targets,
                            const EmulatorParams& start, const StageProfiles& fit = {},
                            const StageProfiles& held_out = {},
                            const std::vector<ArtifactCase>& artifact = {});

/// The errors of `params` on the targets and stage profiles, without fitting (evaluations 0;
/// `fitted` names the parameters a fit would change). `stage_power_limit_w`: the profiled
/// GPUs' board limit.
CalibrationResult evaluate_calibration(const Workload& w,
                                       const std::vector<CalibrationTarget>& targets,
                                       const EmulatorParams& params, double stage_power_limit_w,
                                       const StageProfiles& fit = {},
                                       const StageProfiles& held_out = {},
                                       const std::vector<ArtifactCase>& artifact = {});

}  // namespace kareus
