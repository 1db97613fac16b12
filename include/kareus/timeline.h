// A picture of what a plan does over one iteration: one row per pipeline stage, each 1F1B
// instruction a bar from its predicted start to its end (plan format v2 start_s/end_s), coloured
// by its SM clock, with the clock-switch stall drawn apart and, under each stage, a thin lane
// that shows where the other nano-batch's collectives run overlapped with the computation.
// Several plans (Kareus's and Megatron-LM's) are drawn as panels on one time axis.
//
// Thread-safety: timeline_data is pure; plot_timeline writes files next to the picture.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kareus/plan.h"

namespace kareus {

struct TimelinePanel {
  std::string title;
  const Plan* plan = nullptr;  ///< not owned; must outlive the call
};

/// The data the timeline script draws:
/// {"min_freq_mhz", "max_freq_mhz", "panels": [{"title", "method", "execution",
///   "iteration_time_s", "energy_j", "stages": [{"stage", "end_s", "instructions": [{"label"
///   ("F3"/"B3"), "kind", "microbatch", "freq_mhz", "start_s", "stall_s", "run_start_s",
///   "end_s", "overlapped", "collective_sms"}]}]}]}.
/// One entry in "stages" per pipeline stage of each plan; times are the plan's (seconds from the
/// iteration start); stall_s is the plan's clock_switch_s where the instruction switches clock,
/// else 0; collective_sms is the mean SM count of the instruction's partitions (0 when
/// sequential). min/max_freq_mhz span every instruction's clock (the colour scale). Throws
/// InvalidInput when there is no panel or a panel has no plan.
nlohmann::json timeline_data(const std::vector<TimelinePanel>& panels);

/// Draws the panels to `png_path` with matplotlib (writes plot_timeline.py and
/// PNG_STEM.data.json beside it). Returns false, with the reason in `error`, when no picture
/// was made; the caller reports it.
bool plot_timeline(const std::vector<TimelinePanel>& panels, const std::string& png_path,
                   std::string& error);

}  // namespace kareus
