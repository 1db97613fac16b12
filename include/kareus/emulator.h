// The embedded GPU emulator: an event-driven simulation of one partition (or a kernel sequence)
// on one GPU of its group, and of a whole training iteration under a 1F1B pipeline schedule.
// docs/emulator.md derives the model and lists every parameter with its source or fit.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kareus/hw.h"
#include "kareus/instruction_settings.h"
#include "kareus/partition.h"
#include "kareus/profiler.h"

namespace kareus {

/// Model parameters. Defaults are the published figures and the values fitted by
/// `kareus calibrate` (see docs/emulator.md); `fitted` marks those the fit changes.
struct EmulatorParams {
  // Compute. Efficiencies are fractions of the bf16 tensor peak at the running clock,
  // multiplied by `achieved_fraction` (fitted: how far a real training step is from
  // best-case microbenchmarks). The best-case efficiencies are per GPU (GpuSpec); a value > 0
  // here overrides the GPU's.
  double gemm_best_efficiency = 0;      ///< 0: the GPU's
  double attn_fwd_best_efficiency = 0;  ///< 0: the GPU's
  double attn_bwd_best_efficiency = 0;  ///< 0: the GPU's
  double achieved_fraction = 0.900167;  ///< fitted
  double gemm_tile_m = 128;             ///< CTA tile for wave quantization
  double gemm_tile_n = 256;
  double gemm_k_half = 64;   ///< K at which the main loop reaches half efficiency
  double attn_tile_q = 128;  ///< query rows per CTA
  /// Keys per query row at which attention reaches half its best efficiency (each CTA's fixed
  /// cost: loading its queries, the final rescale and write); 0: off. Fitted.
  double attn_kv_half = 1024;
  double cuda_core_fraction = 1.0 / 16;   ///< non-tensor FLOP rate as a fraction of bf16 peak
  double launch_overhead_s = 7.64001e-6;  ///< fitted
  /// Time of one step of context parallelism's ring exchange (the P2P of the next keys and
  /// values with its launch and wait), per attention call of a CP kernel (Kernel::kv_calls > 1).
  /// It runs under the step's attention, so a step takes the longer of the two. 0: off. Fitted.
  double cp_step_s = 714.261e-6;
  /// Fixed cost of one overlapped partition (the host records and waits on the events that join
  /// the compute and communication streams, and launches the collective on the second stream);
  /// the GPU idles meanwhile. 0: off. Fitted.
  double partition_sync_s = 33.3116e-6;
  // Memory.
  double hbm_efficiency = 0.89;             ///< achievable fraction of peak HBM bandwidth
  double hbm_clock_sensitivity = 0.15;      ///< bandwidth loss at zero SM clock (linear in f)
  double hbm_saturation_sm_fraction = 0.5;  ///< SM share needed to saturate HBM
  // Collectives.
  double nccl_sms_to_saturate = 13.0997;  ///< fitted: CTAs at which a ring reaches the link rate
  double collective_latency_s = 15e-6;
  double collective_hbm_factor = 3.0;  ///< HBM bytes moved per wire byte (read, write, reduce)
  double internode_efficiency = 0.9;
  /// Extra compute slowdown while a collective runs, on top of the SMs the collective holds
  /// and the HBM it shares. Set (by `kareus calibrate`, see calibrate.h) so that the mean
  /// compute slowdown over the calibration workload's partitions under NCCL's default overlap
  /// equals the published 18.9% (arXiv 2507.03114).
  double overlap_slowdown = 0.247343;
  // Power. The clock-power curve is per GPU (GpuSpec::sm_power_w, voltage_ratio,
  // voltage_knee_mhz); a value > 0 here overrides the GPU's (calibration, what-if studies).
  // EmulatorModel::params() returns the values in effect.
  double sm_power_w = 0;              ///< W; 0: the GPU's
  double voltage_ratio = 0;           ///< V(f_max) / V_floor; 0: the GPU's
  double voltage_knee_mhz = 0;        ///< MHz; 0: the GPU's
  double power_limit_w = 0;           ///< W; 0: the GPU's board power limit
  double idle_activity = 0.02;        ///< fitted: SM activity of a resident but stalled kernel
  double collective_activity = 0.25;  ///< SM activity of a copy/reduce CTA
  double hbm_pj_per_bit = 7.0;
  double link_pj_per_bit = 8.0;

  /// Stable text of every field, for fingerprints and `kareus calibrate` output.
  std::string to_string() const;
  std::map<std::string, double*> fields();
};

/// Result of simulating one partition or kernel sequence (one GPU).
struct SimResult {
  double time_s = 0;
  double dynamic_energy_j = 0;  ///< above static power
  double compute_end_s = 0;     ///< when the compute stream finished
  /// When the communication stream finished its chain (the collective and its comm_tail); the
  /// launch time for an empty collective, 0 if there is none.
  double collective_end_s = 0;
};

class EmulatorModel {
 public:
  EmulatorModel(const GpuSpec& gpu, EmulatorParams params = {});

  const GpuSpec& gpu() const { return gpu_; }
  const EmulatorParams& params() const { return p_; }

  /// Partition with the collective launched before compute op `slot.op_index`, `sms` CTAs.
  SimResult simulate_partition(const Partition& part, const PartitionConfig& c) const;
  /// Kernels one after another (collectives alone, with `collective_sms` CTAs).
  SimResult simulate_sequence(const std::vector<Kernel>& kernels, int freq_mhz,
                              int collective_sms) const;
  /// Compute kernels `ops` overlapped with `collective` launched before op `slot_index`, and
  /// after it the kernels of `tail` on the communication stream (Partition::comm_tail): small
  /// kernels on the collective's `sms` SMs while compute runs (the whole GPU once it is done),
  /// collectives on `sms` CTAs.
  SimResult simulate_overlap(const std::vector<Kernel>& ops, const Kernel* collective,
                             int slot_index, int sms, int freq_mhz,
                             const std::vector<Kernel>& tail = {}) const;
  /// Bandwidth a collective can reach on its links (bytes/s): NCCL's ring bus bandwidth inside
  /// a node, one NVLink direction for point-to-point, the NIC across nodes.
  double link_bandwidth(const Kernel& collective) const;

  /// NCCL's default CTA count for a collective (the Nanobatching baseline).
  int default_collective_sms(const Kernel& collective) const;

  /// Voltage relative to the floor at a clock (1 at and below the knee).
  double relative_voltage(double freq_mhz) const;

 private:
  struct Rates;
  Rates rates(const Kernel* op, int op_sms, const Kernel* coll, int coll_sms, double f) const;
  /// simulate_overlap at a fixed clock, without the power cap.
  SimResult simulate_at(const std::vector<Kernel>& ops, const Kernel* collective,
                        const std::vector<Kernel>& tail, int slot_index, int sms,
                        double freq_mhz) const;

  GpuSpec gpu_;
  EmulatorParams p_;
};

/// The emulator behind the Profiler interface: adds seeded multiplicative noise and an optional
/// wall-clock delay per measurement.
class EmulatorProfiler : public Profiler {
 public:
  EmulatorProfiler(const ProfilerOptions& o, EmulatorParams params = {});
  std::string name() const override { return "emulator"; }
  std::string fingerprint() const override;
  const GpuSpec& gpu() const override { return model_.gpu(); }
  double static_power_w() const override { return model_.gpu().static_power_w; }
  std::optional<NoiseRel> noise_rel() const override { return noise_; }
  Measurement measure(const Partition& p, const PartitionConfig& c) override;
  Measurement measure_segment(const Segment& s, int freq_mhz) override;
  const EmulatorModel& model() const { return model_; }

 private:
  Measurement finish(double time_s, double dyn_j, const std::string& noise_key);
  EmulatorModel model_;
  ProfilerOptions opt_;
  NoiseRel noise_;          ///< resolved: time_noise -1 is kTimeNoiseShare x noise, at the window
  std::string window_tag_;  ///< ":window_s=X" away from kReferenceWindowS, else empty
};

// ---- Whole-iteration simulation.

// ExecutionMode and InstructionSettings (how one instruction runs): instruction_settings.h.

/// The settings of one instruction, by virtual stage (the stage itself without interleaving,
/// Schedule::virtual_stage), kind and micro-batch.
using SettingsFn =
    std::function<InstructionSettings(int virtual_stage, InstructionKind kind, int mb)>;

/// When one instruction ran in the replay (seconds from the iteration start).
struct InstructionTiming {
  InstructionKind kind = InstructionKind::kForward;
  int microbatch = 0;
  int freq_mhz = 0;
  double start_s = 0;         ///< dependencies met; a clock-switch stall, if any, starts here
  double end_s = 0;           ///< start_s + (clock_switch ? clock_switch_s : 0) + run time
  bool clock_switch = false;  ///< clock differs from the previous instruction's on the stage
  int chunk = 0;              ///< model chunk (interleaved schedules; 0 otherwise)
};

struct StageResult {
  int stage = 0;
  double energy_j_per_gpu = 0;  ///< static included
  double dynamic_energy_j_per_gpu = 0;
  double busy_time_s = 0;  ///< instructions, messages and reductions; stalls excluded
  int clock_changes = 0;
  std::vector<InstructionTiming> instructions;  ///< in the stage's Schedule::order
};

struct IterationResult {
  double iteration_time_s = 0;
  double energy_j = 0;  ///< whole job (every GPU), one iteration
  std::vector<StageResult> stages;
  double energy_j_per_gpu_sum_over_stages() const;
};

/// Time and dynamic energy of one instruction (one micro-batch, one GPU of the stage).
struct InstructionCost {
  double time_s = 0;
  double dynamic_energy_j = 0;
};

/// What a chunk's last backward costs on top of its own time when the chunk's data-parallel
/// gradient reduce-scatter overlaps it (DpGradOverlap), at the maximum clock with NCCL's
/// default CTAs: the slowdown and the part of the collective that ends after the compute, plus
/// the last bucket's collective.
SimResult dp_grad_increment(const EmulatorModel& m, const DpGradOverlap& o);

InstructionCost emulate_instruction(const PartitionSet& ps, const EmulatorModel& m,
                                    ExecutionMode mode, int stage, InstructionKind kind,
                                    const InstructionSettings& s);

/// The job's pipeline schedule (Workload::schedule: synchronous or interleaved 1F1B over its
/// stages, chunks and micro-batches; Narayanan et al., SC '21). When an
/// instruction's clock differs from the previous instruction's on its stage, the stage first
/// stalls `clock_switch_s` at static power once the instruction's inputs are ready (the
/// controller is told at instruction begin). The first instruction of an iteration never pays:
/// its clock is set during the previous iteration's optimizer step. This overload uses the
/// GPU's catalogue value, m.gpu().clock_switch_s.
IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings);
IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings, double clock_switch_s);
/// The replay with stragglers: every instruction of stage s takes stage_time_factor[s] times as
/// long as the model predicts, at the same dynamic energy (a slow node or a throttled GPU does
/// the same work more slowly; the extra time draws static power, counted through the iteration
/// time). Messages and reductions keep their times. Empty: every stage as modelled. InvalidInput
/// unless there is one finite factor > 0 per pipeline stage.
IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings, double clock_switch_s,
                                  const std::vector<double>& stage_time_factor);

/// The two reference schedules at a uniform clock: `megatron` (no nano-batches, kernels in
/// order) and `nanobatch` (collective at the partition start with NCCL's default CTAs).
IterationResult emulate_schedule(const Workload& w, const EmulatorModel& m,
                                 const std::string& schedule, int freq_mhz);

}  // namespace kareus
