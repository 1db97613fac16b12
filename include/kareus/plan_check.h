// A plan against its workload (kareus_plancheck, src/plancheck): the checks of a plan file that
// need the workload and its partitions. Links the workload, the partitioner and the plan format,
// nothing of the emulator, the search or the planner, so the runtime (C API, Python module) can
// validate the plan it is given.
//
// Thread-safety: free functions of their arguments only.
#pragma once

#include <string>

#include "kareus/partition.h"
#include "kareus/plan.h"
#include "kareus/workload.h"

namespace kareus {

/// Reads a plan file and validates it against the workload (validate_plan).
Plan load_plan(const std::string& path, const Workload& w);
/// Checks a plan (already checked by Plan::from_json) against a workload: digest, GPU, rank
/// layout, model chunks, stage count, per-stage instruction order (Schedule), clocks the GPU
/// supports, clock_switch flags and clock_changes equal to what the freq_mhz sequence gives,
/// partition keys of each instruction, SM counts (1..kMaxCollectiveSms for every partition, the
/// rule of src/search/space.cc, not narrowed to the search defaults), slot names, recompute flags,
/// slot ops, instance counts and mixes. Throws InvalidInput "SOURCE: field 'PATH': what is
/// allowed".
void validate_plan(const Plan& p, const Workload& w, const std::string& source);

/// A digest of a workload's partitions and shape, to tie plans to workloads.
std::string workload_digest(const Workload& w, const PartitionSet& ps);
/// The same, partitioning the workload first.
std::string workload_digest(const Workload& w);

}  // namespace kareus
