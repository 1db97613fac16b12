// The Kareus pipeline, one stage after another (the DuckDB optimizer habit: named passes run in
// order by one driver, each producing a value): partitions -> search of every distinct
// partition -> instruction composition -> iteration DAG -> frontier -> plans. The same driver
// builds the baselines (Megatron-LM, Perseus, Nanobatching, Nanobatching + Perseus) and the
// ablations through the same composition and solver, so every comparison is like for like.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kareus/compose.h"
#include "kareus/frontier.h"
#include "kareus/plan.h"
#include "kareus/plan_check.h"
#include "kareus/screening.h"
#include "kareus/search.h"
#include "kareus/store.h"

namespace kareus {

enum class Method {
  kKareus,            ///< overlapped; clock, SMs and launch slot searched
  kKareusMaxClock,    ///< ablation: overlapped, SMs and slot searched, maximum clock only
  kNanobatchPerseus,  ///< overlapped with NCCL's defaults; clock per instruction (= ablation
                      ///< without scheduling)
  kNanobatch,         ///< overlapped with NCCL's defaults, maximum clock
  kPerseus,           ///< sequential kernels; clock per instruction
  kMegatron,          ///< sequential kernels, maximum clock
};
const char* to_string(Method m);
/// The name a person reads: "Kareus", "Perseus", "Nanobatching+Perseus", "Megatron-LM", ...
const char* display_name(Method m);
Method method_from_string(const std::string& name);  ///< throws InvalidInput listing names

/// What a plan is picked for on a frontier (src/planner/goal.cc). A power cap (kPowerCap per
/// GPU, kJobPowerCap for the whole job) bounds the iteration's average power, whole-job energy /
/// iteration time, static power included, and takes the fastest point within it (ties: less
/// energy); instruction peaks are reported, not capped (docs/cli.md, "Power cap").
enum class GoalKind {
  kDeadline,
  kEnergyBudget,
  kMaxThroughput,
  kMinEnergy,
  kPowerCap,
  kJobPowerCap
};
struct Goal {
  GoalKind kind = GoalKind::kMaxThroughput;
  /// Seconds (deadline), joules (energy budget), watts per GPU (power cap) or kilowatts for the
  /// whole job (job power cap).
  double value = 0;
  int gpus = 0;  ///< power caps: the job's GPUs, which turn the cap into a bound per GPU
  std::string describe() const;
  /// Power caps: the bound on average_power_per_gpu_w (W); a job cap is shared by its GPUs.
  double power_limit_per_gpu_w() const;
  bool power_cap() const { return kind == GoalKind::kPowerCap || kind == GoalKind::kJobPowerCap; }
};

/// Average power per GPU over an iteration (W): whole-job energy / (iteration time x GPUs),
/// static power included; what a power cap bounds.
double average_power_per_gpu_w(double energy_j, double iteration_time_s, int gpus);

/// The frontier points that meet the goal, best first: by energy for a deadline and for
/// min-energy, by time for an energy budget and a power cap (ties: less energy, then the
/// earlier point), the max-throughput point alone (max_throughput_index). Empty if none does.
std::vector<std::size_t> ranked_points(const std::vector<FrontierPoint>& frontier, const Goal& g);
/// The best of ranked_points, or nullopt if no point meets the goal.
std::optional<std::size_t> select_point(const std::vector<FrontierPoint>& frontier, const Goal& g);

struct PlannerOptions {
  std::string strategy = "mbo";
  SearchOptions search;
  double unit_s = 1e-3;        ///< solver time quantum
  bool per_layer = false;      ///< let each layer (instance) of a partition pick its configuration
  std::vector<int> freqs_mhz;  ///< empty: the GPU's default search range
  /// Stall per SM-clock change (s) in every prediction; negative: the GPU's catalogue value
  /// (GpuSpec::clock_switch_s), 0: clock changes are free (the paper's model).
  double clock_switch_s = -1;
  /// Plans keep each clock for at least this long (sum of the instruction times of a run of
  /// equal clocks); shorter runs are merged into a neighbouring run (see hold_clocks). The
  /// frontier also tries longer holds where merging pays for the switches it saves.
  double min_clock_hold_s = 0;
  /// Memory the frontier of one method may take (MiB): the DAG, the instruction options and
  /// one choice per solver step. Checked before the solver runs (InvalidInput naming the limit).
  double frontier_memory_mb = 4096;
  /// Multi-fidelity search (screening.h), used when the Planner is given a screening profiler:
  /// every partition search screens with that profiler's short window and confirms near the
  /// front with the full one. Baselines, segments and clock coverage use the full window.
  ScreeningOptions screening;
  /// After each partition search, measure at every clock the SM count and slot of the
  /// recommended points at the nearest clocks (Planner::complete_clocks).
  bool clock_completion = false;
  /// Smooth every one-point-per-clock sweep the instructions are composed of (each segment, each
  /// partition at NCCL's defaults) across the clocks with smooth_clock_sweep (search.h), at the
  /// search's measurement noise (measurement_noise). A sweep is measured at every clock of the
  /// run the first time any clock of it is asked for, so that every method sees the same value.
  /// On by default: truth-scored iso-time plans lose less energy with it at every budget
  /// measured (docs/search.md, "Smoothed sweeps"). Off where the measurements are exact (the
  /// emulator with --noise 0): every clock is measured and nothing is smoothed.
  bool smooth_sweeps = true;
  /// With smooth_sweeps: measure each sweep at every sweep_stride-th clock counted down from the
  /// fastest (and at the slowest), the smoother filling in the others; without, every clock.
  /// 3 by default: truth-scored iso-time plans were as good as from every clock at 224 and at
  /// 56 points, for 9% and 26% fewer GPU-hours on the paper suite (docs/search.md).
  int sweep_stride = 3;
  /// Plan-directed profiling: after each partition search, measure at each of these clocks up
  /// to focus_points_per_clock configurations the search's model predicts on that clock's front
  /// (predicted_clock_front, search.h). Empty: none. A search spreads its points over every
  /// clock; a plan runs a few, and there the composition needs each partition's front within
  /// the clock (the drivers of focus_rounds set these to the clocks of the plans before).
  std::vector<int> focus_clocks_mhz;
  int focus_points_per_clock = 4;
  /// Rounds of plan-directed profiling in the drivers that hand out plans (`kareus plan`,
  /// `kareus optimize`, evaluate_workload): plan, add the clocks the handed-out plans run at to
  /// focus_clocks_mhz (add_focus_clocks), plan again; stop early when no clock is new. 0: off.
  /// The Planner itself ignores it.
  int focus_rounds = 0;
};

/// Adds the SM clocks `plan`'s instructions run at to o.focus_clocks_mhz (kept ascending and
/// distinct); returns true when any was new.
bool add_focus_clocks(PlannerOptions& o, const Plan& plan);

/// Progress of the pipeline: (stage name, done, total).
using PlannerProgress = std::function<void(const std::string&, std::size_t, std::size_t)>;

struct PartitionSearchSummary {
  std::string key;
  std::size_t space = 0;
  int evaluations = 0;
  int resumed = 0;
  int coverage_points = 0;  ///< extra measurements so that every clock has an option
  /// With screening: the search's points were screened (evaluations of them) and this many
  /// were re-measured with the full window.
  bool screened = false;
  int confirmed = 0;
  int completion_points = 0;  ///< measured by PlannerOptions::clock_completion
  int focus_points = 0;       ///< measured at PlannerOptions::focus_clocks_mhz
  /// The search's prior (SearchResult::prior: "none" for a cold start, also when the prior
  /// knew nothing of this partition) and whether it seeded the initial design.
  std::string prior = "none";
  bool prior_seeded = false;
};

/// Time and dynamic energy of a segment that runs once (a message between stages, a
/// once-per-iteration reduction), per GPU.
struct SegmentRun {
  double time_s = 0;
  double dynamic_energy_j = 0;
  bool operator==(const SegmentRun&) const = default;
};

/// A method's frontier with everything needed to turn points into plans.
struct MethodFrontier {
  Method method = Method::kKareus;
  ExecutionMode execution = ExecutionMode::kOverlapped;
  IterationDag dag;
  /// The instruction options of each (stage, kind), at tables[2 * stage + kind] (kind 0:
  /// forward, 1: backward). 1F1B runs each (stage, kind) once per micro-batch; every such DAG
  /// node shares its table instead of holding a copy.
  std::vector<std::vector<InstructionOption>> tables;
  /// Per DAG node: the index into `tables` of its options, -1 for messages and reductions.
  std::vector<int> node_table;
  SegmentRun p2p;                      ///< one message between neighbouring stages
  std::vector<SegmentRun> reductions;  ///< PartitionSet::iteration_segments, in that order
  /// PartitionSet::dp_grad_overlaps (the increment, dp_grad_increment) and dp_param_gathers,
  /// in that order.
  std::vector<SegmentRun> dp_grad, dp_gather;
  /// Points re-evaluated with clock-switch stalls after hold_clocks; Pareto set, fastest first.
  std::vector<FrontierPoint> points;
  /// The solver's points before that (clock changes free), for comparison.
  std::vector<FrontierPoint> points_without_switch_cost;
  double clock_switch_s = 0;  ///< stall per clock change used for `points`
  double min_clock_hold_s = 0;
  FrontierStats stats;

  /// The instruction options behind node i's DAG options (empty for messages and reductions).
  const std::vector<InstructionOption>& node_options(std::size_t node) const;
};

/// Builds f.dag and f.node_table from f.tables, f.p2p, f.reductions, f.dp_grad and f.dp_gather
/// on the workload's schedule (Workload::schedule; f.dag.static_power_w and f.dag.gpus are
/// kept). The DAG is a pure function of these
/// inputs, so a frontier stored as options and choices rebuilds the same DAG.
void build_iteration_dag(const Workload& w, const PartitionSet& ps, MethodFrontier& f);

/// Memory the frontier of f.dag is expected to take: the DAG, the option tables and one choice
/// per solver step, at most (slowest - fastest makespan) / unit + 1 steps.
struct FrontierMemory {
  double bytes = 0;
  double solver_steps = 0;
  std::size_t options = 0;  ///< instruction options over all tables
};
FrontierMemory frontier_memory(const MethodFrontier& f, double unit_s);

/// Predicted schedule of a frontier point with clock-switch stalls (one entry per DAG node).
struct ClockSchedule {
  std::vector<double> start_s, end_s;  ///< end = start + (switch ? clock_switch_s : 0) + time
  std::vector<bool> clock_switch;      ///< node stalls for a clock change before it runs
  std::vector<int> clock_changes;      ///< per stage
  double makespan_s = 0;
  double dynamic_energy_j = 0;  ///< whole job
  double energy_j = 0;          ///< dynamic + gpus x static power x makespan
};

/// Longest-path schedule of `choice` on the DAG where an instruction whose clock differs from
/// the previous instruction on its stage first stalls `clock_switch_s` at static power (the
/// same rule as emulate_iteration). Messages and reductions never switch clocks.
ClockSchedule schedule_with_switches(const MethodFrontier& f, const std::vector<int>& choice,
                                     double clock_switch_s);

/// What a schedule needs besides the choice: the same for every choice on one frontier, so code
/// that evaluates many choices (the frontier's clock holds, re-planning) computes it once.
struct DagTopology {
  std::vector<std::vector<int>> stages;  ///< instruction nodes of each stage, execution order
  std::vector<std::vector<int>> preds;   ///< per node
  std::vector<int> order;                ///< topological
  explicit DagTopology(const MethodFrontier& f);
};
/// schedule_with_switches on a precomputed topology of `f`.
ClockSchedule schedule_with_switches(const MethodFrontier& f, const DagTopology& t,
                                     const std::vector<int>& choice, double clock_switch_s);
/// The peak instruction power of `choice` on f (W per GPU): the highest instruction_power_w
/// (compose.h: dynamic energy / time + static power) of the options its pipeline instructions
/// run. Messages, once-per-iteration reductions and data-parallel collectives are not
/// instructions and do not count; neither do clock-switch stalls (static power only). Reported
/// for breaker planning (frontier.json, plans), never capped.
double peak_instruction_power_w(const MethodFrontier& f, const std::vector<int>& choice);

/// Per stage, repeatedly removes the shortest run of equal clocks (sum of its instruction
/// times) shorter than `min_hold_s`: it takes the clock of its faster neighbour, or, when it is
/// faster than its neighbours, its shorter neighbour takes its clock (so no instruction gets a
/// slower clock). Instructions that change clock take, at the new clock, the least-energy
/// option no slower than their current one, else the fastest. This repeats until every run
/// lasts at least `min_hold_s` or the stage has one clock. Since the merge order does not
/// depend on `min_hold_s`, a longer hold continues a shorter hold's merges: the number of clock
/// changes never grows with `min_hold_s`.
/// With `toward_faster` false, the same with the slower side (saves energy where there is
/// slack; the frontier tries both).
std::vector<int> hold_clocks(const MethodFrontier& f, const std::vector<int>& choice,
                             double min_hold_s, bool toward_faster = true);
/// hold_clocks for each of the ascending holds `min_holds_s` in one pass: since a longer hold
/// continues a shorter hold's merges, result k equals hold_clocks(f, choice, min_holds_s[k],
/// toward_faster) at the cost of the longest one alone.
std::vector<std::vector<int>> hold_clocks_sequence(const MethodFrontier& f,
                                                   const std::vector<int>& choice,
                                                   const std::vector<double>& min_holds_s,
                                                   bool toward_faster = true);

/// A choice of options (one per DAG node of f) as an executable plan (format v2: rank mapping,
/// slot ops, recompute flags, predicted start/end per instruction with clock-switch stalls).
/// `digest` is workload_digest(w, ps).
Plan materialize_plan(const Workload& w, const PartitionSet& ps, const std::string& digest,
                      const MethodFrontier& f, const std::vector<int>& choice,
                      const std::string& goal);

class Planner {
 public:
  /// With `screen` (a profiler of the same backend and store at o.screening.window_s), the
  /// partition searches screen through it (see PlannerOptions::screening).
  Planner(const Workload& w, CachedProfiler& profiler, PlannerOptions o,
          PlannerProgress progress = {}, CachedProfiler* screen = nullptr);

  /// Stage 2: searches every distinct partition (once; later calls reuse the result).
  const std::vector<PartitionSearchSummary>& search_partitions();
  /// The per-clock options of partition `key` that composition takes from its search (each a
  /// per-clock Pareto set of the estimates; screened: pooled_at_full_window, then
  /// smoothed_estimates). Searches first if needed; throws InvalidInput for an unknown key.
  const PartitionFronts& searched_fronts(const std::string& key);
  /// Stages 3-5 for one method (computed once; later calls return the same frontier). Kareus's
  /// frontier takes the baselines' and its ablation's plans as candidates (they lie in its
  /// space), so it computes those frontiers too.
  MethodFrontier frontier(Method m);
  /// A frontier point as an executable plan (format v2: rank mapping, slot ops, recompute
  /// flags, predicted start/end per instruction with clock-switch stalls).
  Plan make_plan(const MethodFrontier& f, std::size_t point, const std::string& goal) const;
  const PlannerOptions& options() const { return o_; }

  const Workload& workload() const { return w_; }
  const PartitionSet& partitions() const { return ps_; }
  /// Full-window measurements (new, and served by the store).
  int measurements() const { return profiler_.measured(); }
  int reused() const { return profiler_.reused(); }
  /// Screening measurements (new and from the store); 0 without screening.
  int screen_measurements() const { return screen_ ? screen_->measured() + screen_->reused() : 0; }

 private:
  std::vector<InstructionOption> instruction_options(Method m, int stage, InstructionKind k,
                                                     bool per_instance);
  std::vector<InstructionOption> compose_method(Method m, int stage, InstructionKind k,
                                                bool per_instance,
                                                const std::vector<int>& freqs_mhz);
  /// Null `uniform`: one option table per (stage, kind), the same for every layer. Otherwise
  /// per-instance tables, each keeping the options of these uniform tables of the same method
  /// (see keep_clock_options in planner.cc).
  MethodFrontier frontier_with(
      Method m, const std::vector<std::vector<InstructionOption>>* uniform = nullptr);
  void compose_tables(MethodFrontier& mf,
                      const std::vector<std::vector<InstructionOption>>* uniform);
  void check_frontier_memory(const MethodFrontier& mf) const;
  MethodFrontier frontier_layers(Method m);  ///< uniform, or per-layer with the uniform points
  void apply_clock_switch_cost(MethodFrontier& mf) const;
  PartitionOption segment_cost(const Segment& s, int freq_mhz);
  /// segment_cost within an instruction: from the smoothed sweep with o_.smooth_sweeps.
  PartitionOption instruction_segment_cost(const Segment& s, int freq_mhz);
  /// The measurements of `configs` (one partition), each taken from its smoothed sweep over
  /// the run's clocks (same SMs and slot) with o_.smooth_sweeps, else as measured.
  std::vector<Measurement> sweep_measurements(const Partition& p,
                                              const std::vector<PartitionConfig>& configs);
  /// The run's clocks, ascending, when sweeps are smoothed (at least 4 clocks, measurements
  /// with noise); empty otherwise.
  std::vector<int> smoothing_clocks() const;
  /// The clocks of smoothing_clocks() a sweep is measured at (PlannerOptions::sweep_stride).
  std::vector<int> sweep_clocks() const;
  /// The smoothed sweep `key` per clock of smoothing_clocks(), measured on first use by
  /// `measure` at sweep_clocks() (one measurement per clock given).
  const std::map<int, Measurement>& smoothed_sweep(
      const std::string& key,
      const std::function<std::vector<Measurement>(const std::vector<int>&)>& measure);
  int complete_clocks(const Partition& p, const SearchSpace& space, SearchResult& r);
  int focus_clocks(const Partition& p, const SearchSpace& space, SearchResult& r);
  /// What the planner estimates a partition's points with (smoothed_estimates).
  SearchOptions estimate_options() const;
  /// Measures `extra` (none of them among r.points) with the full window and re-estimates.
  int add_points(const Partition& p, const SearchSpace& space, SearchResult& r,
                 const std::vector<PartitionConfig>& extra);
  PartitionConfig baseline_config(const Partition& p, int freq_mhz) const;
  const PartitionSet& sequential_partitions();

  Workload w_;
  PartitionSet ps_;
  std::string digest_;  ///< workload_digest(w_, ps_), shared by every plan
  std::optional<PartitionSet> seq_ps_;
  CachedProfiler& profiler_;
  CachedProfiler* screen_ = nullptr;
  PlannerOptions o_;
  PlannerProgress progress_;
  std::vector<int> freqs_;
  bool searched_ = false;
  std::vector<PartitionSearchSummary> summaries_;
  std::map<std::string, PartitionFronts> searched_fronts_;  ///< by partition key
  std::map<Method, MethodFrontier> frontiers_;              ///< frontier(m), computed once
  /// Smoothed sweeps, per clock: segments by signature and name, partitions by key and
  /// (SMs, slot).
  std::map<std::string, std::map<int, Measurement>> smoothed_;
  /// Under --per-layer: the same job planned uniformly, whose points the per-layer frontier
  /// takes (frontier()).
  std::shared_ptr<Planner> uniform_planner_;
};

/// The DAG in the `--dump-dag` JSON format.
nlohmann::json dag_to_json(const IterationDag& dag);

}  // namespace kareus
