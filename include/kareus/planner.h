// The Kareus pipeline, one stage after another (the DuckDB optimizer habit: named passes run in
// order by one driver, each producing a value): partitions -> search of every distinct
// partition -> instruction composition -> iteration DAG -> frontier -> plans. The same driver
// builds the baselines (Megatron-LM, Perseus, Nanobatching, Nanobatching + Perseus) and the
// ablations through the same composition and solver, so every comparison is like for like.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kareus/compose.h"
#include "kareus/frontier.h"
#include "kareus/plan.h"
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
Method method_from_string(const std::string& name);  ///< throws InvalidInput listing names

struct PlannerOptions {
  std::string strategy = "mbo";
  SearchOptions search;
  double unit_s = 1e-3;        ///< solver time quantum
  bool per_layer = false;      ///< let each layer (instance) of a partition pick its configuration
  std::vector<int> freqs_mhz;  ///< empty: the GPU's default search range
};

/// Progress of the pipeline: (stage name, done, total).
using PlannerProgress = std::function<void(const std::string&, std::size_t, std::size_t)>;

struct PartitionSearchSummary {
  std::string key;
  std::size_t space = 0;
  int evaluations = 0;
  int resumed = 0;
  int coverage_points = 0;  ///< extra measurements so that every clock has an option
};

/// A method's frontier with everything needed to turn points into plans.
struct MethodFrontier {
  Method method = Method::kKareus;
  ExecutionMode execution = ExecutionMode::kOverlapped;
  IterationDag dag;
  /// Per DAG node: the instruction options behind its DAG options (empty for P2P/iteration).
  std::vector<std::vector<InstructionOption>> node_options;
  std::vector<FrontierPoint> points;
  FrontierStats stats;
};

class Planner {
 public:
  Planner(const Workload& w, CachedProfiler& profiler, PlannerOptions o,
          PlannerProgress progress = {});

  /// Stage 2: searches every distinct partition (once; later calls reuse the result).
  const std::vector<PartitionSearchSummary>& search_partitions();
  /// Stages 3-5 for one method.
  MethodFrontier frontier(Method m);
  /// A frontier point as an executable plan.
  Plan make_plan(const MethodFrontier& f, std::size_t point, const std::string& goal) const;

  const Workload& workload() const { return w_; }
  const PartitionSet& partitions() const { return ps_; }
  int measurements() const { return profiler_.measured(); }
  int reused() const { return profiler_.reused(); }

 private:
  std::vector<InstructionOption> instruction_options(Method m, int stage, InstructionKind k,
                                                     bool per_instance);
  MethodFrontier frontier_with(Method m, bool per_instance);
  PartitionOption segment_cost(const Segment& s, int freq_mhz);
  const PartitionSet& sequential_partitions();

  Workload w_;
  PartitionSet ps_;
  std::string digest_;  ///< workload_digest(w_, ps_), shared by every plan
  std::optional<PartitionSet> seq_ps_;
  CachedProfiler& profiler_;
  PlannerOptions o_;
  PlannerProgress progress_;
  std::vector<int> freqs_;
  bool searched_ = false;
  std::vector<PartitionSearchSummary> summaries_;
  std::map<std::string, PartitionFronts> searched_fronts_;  ///< by partition key
};

/// The DAG in the `--dump-dag` JSON format.
nlohmann::json dag_to_json(const IterationDag& dag);

}  // namespace kareus
