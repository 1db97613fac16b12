// frontier.json, written by `kareus optimize` and read by `kareus plan --from`: every method's
// frontier in compact form, so that a plan for any goal is picked and materialized without
// profiling or solving again.
//
// A point is stored as its choice of option per pipeline instruction (per stage, in 1F1B order,
// an index into that stage's forward or backward option table), not as a plan: the option tables
// (clock, time, energy and each partition's SMs and slot) appear once per (stage, kind), which is
// what makes the file small (a plan repeats them for every micro-batch). Two more things keep it
// small on deep pipelines with many micro-batches: a table holds only the options some point
// uses (the planner's tables run to thousands of options per instruction, of which the points
// use a few dozen), and a stage's choices are run-length encoded ([option, count] pairs: a
// steady 1F1B phase repeats one option). Each point also states its average power per GPU and
// its peak instruction power (planner.h), derived values that reading checks against the
// point's energy, time and options. The file also holds what materializing needs and what
// detects a stale file:
//  - the workload file's text and the name it was read under, and its digest;
//  - the planning options it was computed with;
//  - `inputs_hash`, FNV-1a over all of the above and every table and point: a file edited by
//    hand, truncated or merged from two runs no longer matches it.
// The rest of the file (metrics, summaries) is the evaluation's JSON (evaluate.h's to_json).
//
// Thread-safety: plain functions over value types.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kareus/planner.h"

namespace kareus {

inline constexpr const char* kFrontierFormat = "kareus-frontier";
inline constexpr int kFrontierVersion = 5;

/// A point of one method's frontier.
struct FrontierRef {
  Method method = Method::kKareus;
  std::size_t index = 0;
  bool operator==(const FrontierRef&) const = default;
};

/// One method's frontier: option tables, message and reduction costs, static power, clock
/// switch settings and the points as choices.
nlohmann::json method_frontier_to_json(const MethodFrontier& f);

/// The frontier part of frontier.json: {"methods": {name: method_frontier_to_json}, "points":
/// the merged frontier, each with its method and index into that method's points}.
nlohmann::json frontiers_to_json(const std::map<Method, MethodFrontier>& f,
                                 const std::vector<FrontierRef>& merged);

/// Completes `j` (which holds frontiers_to_json's keys) into frontier.json: format, version,
/// the workload (`workload_yaml`, the text `w` was parsed from), the planning options and
/// inputs_hash.
void add_frontier_identity(nlohmann::json& j, const Workload& w, const std::string& workload_yaml,
                           const PlannerOptions& o);

/// frontier.json's text: one top-level key per line, each value compact. Indenting every array
/// element (a run of choices is [index, count]) would make the file four times larger.
std::string frontier_file_text(const nlohmann::json& j);

/// A loaded frontier.json with every method's DAG rebuilt, ready for materialize_plan.
// clang-tidy 14 reports this aggregate's implicit special members under
// bugprone-exception-escape without naming a throw site (as for WorkloadEvaluation).
// NOLINTNEXTLINE(bugprone-exception-escape)
struct FrontierFile {
  std::string source;  ///< the path it was read from
  Workload workload;
  PartitionSet partitions;
  std::string digest;      ///< workload_digest(workload, partitions)
  nlohmann::json planner;  ///< the planning options it was computed with
  std::map<Method, MethodFrontier> methods;
  std::vector<FrontierRef> merged;  ///< Kareus's frontier merged with the baselines

  /// The frontier of `m` (throws InvalidInput listing the stored methods).
  const MethodFrontier& method(Method m) const;
  /// A point of `m` as a plan.
  Plan plan(Method m, std::size_t point, const std::string& goal) const;
};

/// Reads frontier.json. Throws InvalidInput naming the file and the field when it is not a
/// frontier file, has another version, does not match its inputs_hash, or was computed for a
/// workload whose digest this build computes differently (a stale file).
FrontierFile load_frontier_file(const std::string& path);

/// Throws InvalidInput when `w` (a workload file given beside the frontier) is not the one the
/// frontier was computed for.
void check_frontier_workload(const FrontierFile& f, const Workload& w);

}  // namespace kareus
