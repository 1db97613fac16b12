// Executable plans, format version 2 (docs/formats.md is the reference): what a training job
// needs to run one frontier point. A plan is JSON with
//  - the workload's identity (name, digest, GPU, GPU count) and the parallel layout with the
//    rank mapping (Megatron-LM's default order: tp fastest, then cp, then dp, then pp);
//  - per pipeline stage: its global ranks, and its instructions in the schedule's order
//    (include/kareus/schedule.h), each with its micro-batch, model chunk, SM clock, predicted
//    start/end (s from the iteration start) and, per partition, the collective's SM count, its
//    launch slot (and the compute op it launches before), whether the partition is a recomputed
//    forward block, and an optional per-layer `mix`;
//  - the predicted iteration time and whole-job energy, including the clock-switch stalls the
//    plan's clock sequence costs (`clock_switch_s` per change).
// The runtime (C API, Python module, frequency controller) and `kareus emulate --plan` read the
// same file. Loading with a workload validates every field against it (plan_check.h); each
// violation throws InvalidInput naming the file, the JSON path of the field and what is allowed.
// This header and kareus_plan depend on nothing but kareus_common.
//
// Thread-safety: plain value types; concurrent reads are safe.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kareus/instruction_settings.h"
#include "kareus/schedule.h"

namespace kareus {

/// Global ranks of a job laid out as Megatron-LM's RankGenerator does by default (order
/// "tp-cp-ep-dp-pp" with ep = 1): rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
/// So the ranks of pipeline stage s are the contiguous block [s*tp*cp*dp, (s+1)*tp*cp*dp).
struct RankLayout {
  static constexpr const char* kOrder = "tp-cp-dp-pp";  ///< fastest-varying first
  int tp = 1, cp = 1, dp = 1, pp = 1;

  struct Coords {
    int tp = 0, cp = 0, dp = 0, pp = 0;
    bool operator==(const Coords&) const = default;
  };
  int gpus() const { return tp * cp * dp * pp; }
  int gpus_per_stage() const { return tp * cp * dp; }
  /// Global rank of a coordinate (throws InvalidInput when a coordinate is out of range).
  int rank(const Coords& c) const;
  /// Coordinates of a global rank (throws InvalidInput unless 0 <= rank < gpus()).
  Coords coords(int rank) const;
  /// The global ranks of a pipeline stage, ascending.
  std::vector<int> stage_ranks(int stage) const;
  bool operator==(const RankLayout&) const = default;
};

/// One share of a per-layer choice: instances [first_instance, first_instance + instances) of
/// the partition in this instruction, counted in execution order from 0, use this setting.
struct PlanMixEntry {
  int sms = 0;
  std::string slot;
  std::string slot_op;     ///< compute op before which the collective launches
  int slot_op_index = 0;   ///< its index among the partition's compute ops
  int first_instance = 0;  ///< first occurrence (0-based, execution order) using this entry
  int instances = 0;
  bool operator==(const PlanMixEntry&) const = default;
};

/// How one partition runs inside one instruction. The partition pairs one nano-batch's compute
/// block with the other nano-batch's collective; the collective gets `sms` SMs (NCCL CTAs) and
/// is launched right before compute op `slot_op` (index `slot_op_index`) of the block.
struct PlanPartition {
  int sms = 0;
  std::string slot;       ///< launch slot name, one of Partition::slot_names()
  std::string slot_op;    ///< compute op before which the collective launches
  int slot_op_index = 0;  ///< its index among the partition's compute ops (0: block start)
  /// A forward block re-run inside a backward instruction (full activation recompute).
  bool recompute = false;
  int instances = 0;  ///< occurrences of this partition per micro-batch in this instruction
  /// Per-layer choices (planning with --per-layer); empty: every instance uses sms/slot.
  /// Entries are in execution order and cover the instances exactly once.
  std::vector<PlanMixEntry> mix;
  bool operator==(const PlanPartition&) const = default;
};

struct PlanInstruction {
  InstructionKind kind = InstructionKind::kForward;
  int microbatch = 0;
  int chunk = 0;                ///< model chunk (interleaved schedules; 0 otherwise)
  int freq_mhz = 0;             ///< SM clock the instruction runs at
  double time_s = 0;            ///< predicted run time, one GPU, without a clock-switch stall
  double dynamic_energy_j = 0;  ///< predicted, one GPU
  /// Predicted start and end, seconds from the iteration start on this stage's GPUs. When
  /// `clock_switch` is set, the instruction first stalls clock_switch_s while the clock
  /// changes: end_s = start_s + clock_switch_s + time_s.
  double start_s = 0;
  double end_s = 0;
  bool clock_switch = false;  ///< the clock differs from the previous instruction's on the stage
  /// In an overlapped plan: this instruction runs its micro-batch whole, kernels in sequence
  /// (no nano-batches, no partitions), where overlap does not pay. Always true in a
  /// sequential plan.
  bool sequential = false;
  std::map<std::string, PlanPartition> partitions;  ///< by partition key (empty if sequential)

  /// The settings the emulator replays.
  InstructionSettings settings() const;
};

/// When a data-parallel collective runs on the stage's communication stream (predicted, s from
/// the iteration start): a chunk's gradient reduce-scatter from its last backward's start to
/// the end of the part that outlasts it, or its parameter all-gather.
struct PlanDpCollective {
  std::string collective;  ///< "grad_reducescatter" or "param_allgather"
  int chunk = 0;
  double start_s = 0;
  double end_s = 0;
  bool operator==(const PlanDpCollective&) const = default;
};

struct PlanStage {
  int stage = 0;
  std::vector<int> ranks;  ///< global ranks forming this stage (RankLayout::stage_ranks)
  int clock_changes = 0;   ///< consecutive instructions with different clocks
  double end_s = 0;        ///< predicted end of the stage's work, reductions included
  std::vector<PlanInstruction> instructions;     ///< in the schedule's execution order
  std::vector<PlanDpCollective> dp_collectives;  ///< with overlapped data-parallel communication

  /// The clock sequence, run-length compressed: (freq_mhz, consecutive instructions).
  std::vector<std::pair<int, int>> clock_runs() const;
};

struct Plan {
  static constexpr int kVersion = 2;
  /// Relative slack (of iteration_time_s) by which a stage's or an instruction's end_s may
  /// exceed the bound it must respect, for rounding in hand-edited or re-serialized files.
  static constexpr double kTimeTolerance = 1e-9;
  std::string workload;         ///< workload name
  std::string workload_digest;  ///< partition signatures: a plan only runs on its workload
  std::string gpu;
  int gpus = 0;
  RankLayout layout;
  int chunks = 1;      ///< model chunks per stage (parallel.virtual_pipeline)
  std::string method;  ///< kareus, perseus, nanobatch_perseus, ...
  /// What a person calls the plan: the method's display name, or, where Kareus fell back to a
  /// baseline's plan, e.g. "Kareus (Perseus plan)" (method then names the baseline).
  std::string label;
  ExecutionMode execution = ExecutionMode::kOverlapped;
  std::string goal;             ///< e.g. "deadline 5.0 s", "max-throughput"
  double iteration_time_s = 0;  ///< predicted, clock-switch stalls included
  double energy_j = 0;          ///< predicted, whole job, one iteration
  double static_power_w = 0;
  double clock_switch_s = 0;    ///< stall per clock change assumed by the prediction
  double min_clock_hold_s = 0;  ///< planning option the clock sequence was built with
  /// For a deadline goal: the relative margin the prediction had to keep below the deadline
  /// (`kareus plan --margin`), and the iteration time the emulator replayed (also for a power
  /// cap); negative: not recorded (not written).
  double deadline_margin = -1;
  double replayed_time_s = -1;
  /// Re-planned around stragglers (kareus plan --stage-slowdown, include/kareus/replan.h): per
  /// stage, the factor by which its instructions' times were stretched in the prediction; empty:
  /// none (the field is not written).
  std::vector<double> stage_slowdown;
  /// Predicted average power per GPU over the iteration (energy_j / (iteration_time_s x gpus))
  /// and the peak instruction power (the highest dynamic energy / time + static power of any
  /// instruction, per GPU; peak_instruction_power_w in planner.h), in W. Optional in the file
  /// (plans from before them lack them); negative: not recorded.
  double avg_power_per_gpu_w = -1;
  double peak_instruction_power_w = -1;
  /// For a power-cap goal with the emulator backend: the average power per GPU the emulator
  /// replayed (W), at most the cap (replayed_time_s then holds the replayed time); negative: none.
  double replayed_avg_power_per_gpu_w = -1;
  /// The GPU's power model (GpuSpec::power_calibrated, power_source) the energies come from.
  bool power_calibrated = false;
  std::string power_source;
  std::vector<PlanStage> stages;

  nlohmann::json to_json() const;
  /// Parses the structure (types, enums, version) and checks what needs no workload: times,
  /// energies and powers finite and non-negative (iteration_time_s and energy_j > 0), each
  /// instruction's end_s >= start_s, starts non-decreasing within a stage, ends within the
  /// stage's end_s and stage ends within iteration_time_s (up to kTimeTolerance). The derived
  /// clock_switch flags and clock_changes are checked by validate_plan, after the clocks.
  /// `source` names the file in error messages; each violation throws InvalidInput. A
  /// version-1 file is refused with a message saying how to re-create it.
  static Plan from_json(const nlohmann::json& j, const std::string& source);
  /// The instruction settings the emulator replays, by virtual stage (SettingsFn; throws
  /// InvalidInput if one is missing).
  InstructionSettings settings(int virtual_stage, InstructionKind kind, int microbatch) const;
  /// The stage a global rank belongs to (throws InvalidInput when out of range).
  int stage_of_rank(int rank) const;
  int clock_changes() const;  ///< summed over stages
  /// Predicted energy of one GPU of `stage` over one iteration (J, static power included), what
  /// NVML's energy counter of that GPU should read (the runtime's energy monitor compares them):
  /// the dynamic energy of the stage's instructions, plus static_power_w x iteration_time_s,
  /// plus an equal share per GPU of the rest of energy_j (P2P messages, once-per-iteration
  /// reductions and data-parallel collectives, which the plan records only in the total;
  /// negative rest, possible only in a plan edited by hand, counts as 0). Summed over every GPU
  /// of the job it gives energy_j. Throws InvalidInput for a stage out of range.
  double gpu_energy_j(int stage) const;
};

/// Reads a plan file and checks it without a workload (Plan::from_json), for tools that have
/// none at hand. With a workload: load_plan in plan_check.h.
Plan load_plan(const std::string& path);
/// Throws the InvalidInput every plan check uses: "SOURCE: field 'PATH': WHAT" (the parser and
/// validate_plan report a bad field the same way).
[[noreturn]] void throw_plan_field_error(const std::string& source, const std::string& path,
                                         const std::string& what);
void save_plan(const Plan& p, const std::string& path);

/// Human summary of a plan (`kareus plan show`): per stage the ranks, the run-length
/// compressed clock sequence, the number of clock changes, the SM/slot choices per partition,
/// predicted time and energy.
std::string plan_summary_text(const Plan& p);
/// The plan's power figures, one line ("power per GPU: average ..., peak instruction ...";
/// with a power cap's replay), or "" when the plan records none.
std::string plan_power_text(const Plan& p);
nlohmann::json plan_summary_json(const Plan& p);

}  // namespace kareus
