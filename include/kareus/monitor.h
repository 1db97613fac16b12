// The energy monitor of one rank: what a plan actually costs on the GPU the rank computes on.
//
// A training job creates one EnergyMonitor per rank and brackets every iteration with
// begin_iteration() / end_iteration(); every pipeline instruction is timed by
// begin_instruction() / end_instruction(), which the instruction hooks of the C API and the
// Python module call by themselves when a monitor is attached to them. An iteration's energy is
// the difference of NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since
// the driver loaded, the whole board: static power included) between its two ends, on this rank's
// GPU only; times come from a steady clock. With `per_instruction` each instruction also gets
// its own counter window. Every finished iteration (and instruction, with `per_instruction`) is
// one JSON line appended to `out_path` with one write(), so a killed run keeps every finished
// record; close() (or destruction) appends the summary. docs/formats.md, "Energy monitor
// records", is the format; docs/runtime.md, "Energy monitor", the guide.
//
// NVML is opened read-only (nvml::Access::kReadOnly): the monitor never changes a card
// setting. Without NVML (MonitorOptions::nvml false, no driver, a GPU without an energy
// counter) it records times only and says so in every record ("energy_j": null and a "note")
// and in the summary. A counter that goes down (driver reload, wrap-around) or a failed read
// leaves that record's energy null with a note; it never ends the training.
//
// Reading monitor files back and merging the ranks of a job (`kareus monitor merge`):
// read_monitor_file and merge_monitor_files below.
//
// Thread-safety: one monitor is used by one thread (the training loop's); distinct monitors may
// be used concurrently.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kareus/error.h"
#include "kareus/schedule.h"

namespace kareus {
struct Plan;
}

namespace kareus::runtime {

/// What a plan predicts for one GPU of the monitored rank's stage, per iteration.
struct MonitorPrediction {
  double iteration_time_s = 0;  ///< the plan's iteration_time_s (clock-switch stalls included)
  double energy_j = 0;          ///< one GPU of the stage (Plan::gpu_energy_j), static included
  std::string source;           ///< where it comes from (the plan's path), for the summary

  /// The prediction of `plan` for a GPU of `stage` (InvalidInput for a stage it does not have).
  static MonitorPrediction from_plan(const Plan& plan, int stage, std::string source = "");
};

struct MonitorOptions {
  int rank = 0;   ///< global rank, written into every record
  int stage = 0;  ///< the plan's pipeline stage of the rank
  /// Which GPU, as ControllerOptions (include/kareus/runtime.h): gpu_uuid, else pci_bus_id, else
  /// gpu_index (NVML's index: neither CUDA's order nor filtered by CUDA_VISIBLE_DEVICES; prefer
  /// the UUID or the bus id of the rank's CUDA device, docs/runtime.md "Which GPU"). At most
  /// one of gpu_uuid and pci_bus_id.
  int gpu_index = 0;
  std::string gpu_uuid;
  std::string pci_bus_id;
  /// false: never load NVML, record times only. true: NVML if it can be loaded, else times only.
  bool nvml = true;
  std::string nvml_library;  ///< empty: $KAREUS_NVML_LIBRARY, else libnvidia-ml.so.1
  /// Also an NVML energy window per instruction, written as its own record.
  bool per_instruction = false;
  /// JSON-lines file the records are appended to (one write() per line); empty: none (the
  /// records are still kept, records()).
  std::string out_path;
  /// The plan's prediction, for the summary's comparison; nullopt: no comparison.
  std::optional<MonitorPrediction> prediction;
  /// Tokens the whole job trains per iteration (for J/token); nullopt: not reported.
  std::optional<double> tokens_per_iteration;
};

/// One finished iteration of one rank: a line with "record": "iteration".
struct IterationRecord {
  int rank = 0;
  int stage = 0;
  int iteration = 0;        ///< 0-based count of this monitor's iterations
  double start_unix_s = 0;  ///< wall clock at begin_iteration: s since the Unix epoch, to 1 us
  double time_s = 0;        ///< begin_iteration to end_iteration, steady clock
  /// NVML total-energy counter difference over the iteration, this GPU only; nullopt in
  /// times-only mode or after a counter problem (then `note` says which).
  std::optional<double> energy_j;
  std::optional<double> avg_power_w;  ///< energy_j / time_s
  double busy_time_s = 0;             ///< sum of the iteration's instruction times
  int instructions = 0;               ///< instructions ended in the iteration
  std::string gpu_uuid;               ///< the measured GPU's UUID; empty without energy
  std::string note;                   ///< why energy_j is missing; empty: nothing to say

  nlohmann::json to_json() const;
};

/// One finished instruction: a line with "record": "instruction" (written with per_instruction).
struct InstructionRecord {
  int rank = 0;
  int stage = 0;
  int iteration = 0;  ///< the iteration it ran in
  InstructionKind kind = InstructionKind::kForward;
  int microbatch = 0;
  int chunk = 0;
  double start_unix_s = 0;
  double time_s = 0;
  std::optional<double> energy_j;  ///< only with per_instruction and NVML
  std::optional<double> avg_power_w;
  std::string note;

  nlohmann::json to_json() const;
};

/// The monitor's totals so far, and the comparison with the plan's prediction: a line with
/// "record": "summary" (written by close()).
struct MonitorSummary {
  int rank = 0;
  int stage = 0;
  std::string gpu_uuid;
  int iterations = 0;
  double time_s = 0;       ///< all iterations
  double busy_time_s = 0;  ///< all instructions
  int instructions = 0;
  int energy_iterations = 0;  ///< iterations with an energy
  double energy_time_s = 0;   ///< their time
  double energy_j = 0;        ///< their energy
  std::optional<double> tokens_per_iteration;
  std::optional<MonitorPrediction> prediction;
  std::string note;  ///< times-only mode, iterations without energy

  std::optional<double> time_per_iteration_s() const;
  std::optional<double> energy_per_iteration_j() const;  ///< over energy_iterations
  std::optional<double> avg_power_w() const;             ///< energy_j / energy_time_s
  /// This GPU's energy per token of the job (the job's J/token is the sum over its GPUs).
  std::optional<double> energy_per_token_j() const;
  nlohmann::json to_json() const;
};

/// The energy monitor of one rank (see the file comment). Not copyable.
class EnergyMonitor {
 public:
  /// Opens NVML read-only and selects the GPU (unless `nvml` is false), then opens `out_path`
  /// for appending. Throws InvalidInput for bad options, a GPU NVML does not have (an unknown
  /// UUID or bus id, an index out of range) or a path that cannot be opened. A missing or
  /// failing NVML is not an error: the monitor then records times only.
  explicit EnergyMonitor(const MonitorOptions& o);
  /// close(); a failure is printed on stderr, not thrown. In a forked child of the process that
  /// created the monitor (a data-loader worker) nothing is written to the file.
  ~EnergyMonitor();
  EnergyMonitor(const EnergyMonitor&) = delete;
  EnergyMonitor& operator=(const EnergyMonitor&) = delete;

  /// Starts an iteration: reads the clocks and the energy counter. StateError while one is open
  /// or after close().
  void begin_iteration();
  /// Ends it, writes its record and returns it. StateError without an open iteration or while
  /// an instruction is open.
  IterationRecord end_iteration();
  /// Starts timing an instruction of the open iteration (with per_instruction also its energy
  /// window). StateError outside an iteration or while another instruction is open;
  /// InvalidInput for a negative micro-batch or chunk.
  void begin_instruction(InstructionKind kind, int microbatch, int chunk = 0);
  /// Ends the open instruction, which must be (kind, microbatch, chunk) (StateError otherwise),
  /// adds its time to the iteration's busy time and returns its record (written to the file
  /// only with per_instruction).
  InstructionRecord end_instruction(InstructionKind kind, int microbatch, int chunk = 0);

  /// Drops the open instruction, if any, without a record or busy time (an aborted iteration:
  /// the hooks' reset calls it).
  void cancel_instruction();

  /// The totals so far (also after close()).
  MonitorSummary summary() const;
  /// Writes the summary record once; later calls do nothing. begin_* then throw StateError.
  void close();
  bool closed() const;

  int rank() const;
  int stage() const;
  bool iteration_open() const;
  /// Whether NVML energy is being read (false: times-only mode, times_only_reason() says why).
  bool energy_available() const;
  std::string times_only_reason() const;
  /// Every record so far as its JSON line without the newline, in order (the summary last after
  /// close()). References stay valid until the monitor is destroyed.
  const std::deque<std::string>& records() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Reading monitor files back (`kareus monitor merge`).

/// One rank's monitor file. Instruction records are checked and skipped; a summary record, if
/// any, supplies the GPU's UUID where the iteration records have none.
struct MonitorFile {
  std::string path;
  int rank = 0;
  int stage = 0;
  std::string gpu_uuid;                     ///< empty: none recorded (times only)
  std::vector<IterationRecord> iterations;  ///< in file order
  std::vector<int> lines;                   ///< the line (1-based) of each iteration record
};

/// Reads a monitor file. Throws InvalidInput naming the file, the line and the field for a
/// missing file, a line that is not a JSON object, a line of another format (no "record"), an
/// unknown record, a field missing or of the wrong type or range, records of two ranks or
/// stages, an iteration number seen twice (two runs appended to one file) and a file without
/// iteration records.
MonitorFile read_monitor_file(const std::string& path);

/// The job's figures of one iteration, over the ranks.
struct JobIteration {
  int iteration = 0;
  double time_s = 0;                          ///< max over the ranks
  std::optional<double> energy_j;             ///< sum over the ranks; nullopt if one lacks it
  std::optional<double> avg_power_per_gpu_w;  ///< energy_j / (time_s x ranks)
  /// Per stage (index = stage): max over the stage's ranks of their busy time; nullopt for a
  /// stage no file covers.
  std::vector<std::optional<double>> stage_busy_time_s;
};

/// The merged job: per iteration and in total.
struct JobRun {
  std::vector<MonitorFile> files;  ///< by rank
  int stages = 0;                  ///< highest stage + 1
  /// The iterations every file holds, ascending; the others are named in `notes`.
  std::vector<JobIteration> iterations;
  std::vector<std::string> notes;

  double time_s() const;  ///< summed over iterations
  int energy_iterations() const;
  std::optional<double> energy_j() const;  ///< over the iterations with an energy
  std::optional<double> time_per_iteration_s() const;
  std::optional<double> energy_per_iteration_j() const;
  std::optional<double> avg_power_per_gpu_w() const;  ///< energy over (their time x ranks)
};

/// Reads and merges per-rank files (read_monitor_file). Throws InvalidInput for no files, two
/// files of one rank, two ranks that measured the same GPU (its energy would count twice), or
/// no iteration common to every file.
JobRun merge_monitor_files(const std::vector<std::string>& paths);

}  // namespace kareus::runtime
