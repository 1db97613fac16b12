// Timeline of a plan over one iteration, drawn from plan format v2's predicted instruction start
// and end times (the planner's schedule of the iteration DAG; the orders are Schedule's,
// Narayanan et al., SC '21). The picture follows the usual pipeline-schedule diagrams (GPipe,
// Megatron-LM): time runs right, one row per stage; here each bar also carries its SM clock as a
// colour.
#include "kareus/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "kareus/error.h"
#include "kareus/kernel_graph.h"
#include "plot.h"
#include "plot_timeline_script.h"

namespace kareus {
namespace {

nlohmann::json instruction_json(const PlanInstruction& in, double clock_switch_s,
                                bool interleaved) {
  const double stall_s = in.clock_switch ? clock_switch_s : 0.0;
  double sms = 0;
  for (const auto& [key, part] : in.partitions) sms += part.sms;
  if (!in.partitions.empty()) sms /= static_cast<double>(in.partitions.size());
  const char* kind = in.kind == InstructionKind::kForward ? "F" : "B";
  return {{"label", interleaved ? fmt::format("{}{}c{}", kind, in.microbatch, in.chunk)
                                : fmt::format("{}{}", kind, in.microbatch)},
          {"kind", to_string(in.kind)},
          {"microbatch", in.microbatch},
          {"chunk", in.chunk},
          {"freq_mhz", in.freq_mhz},
          {"start_s", in.start_s},
          {"stall_s", stall_s},
          {"run_start_s", std::min(in.end_s, in.start_s + stall_s)},
          {"end_s", in.end_s},
          {"overlapped", !in.partitions.empty()},
          {"collective_sms", sms}};
}

}  // namespace

nlohmann::json timeline_data(const std::vector<TimelinePanel>& panels) {
  if (panels.empty()) throw InvalidInput("timeline: no plan to draw");
  nlohmann::json j;
  j["panels"] = nlohmann::json::array();
  int fmin = 0, fmax = 0;
  for (const auto& panel : panels) {
    if (panel.plan == nullptr)
      throw InvalidInput("timeline: panel '" + panel.title + "' has no plan");
    const Plan& p = *panel.plan;
    nlohmann::json pj = {
        {"title", panel.title},
        {"method", p.method},
        {"execution", p.execution == ExecutionMode::kOverlapped ? "overlapped" : "sequential"},
        {"iteration_time_s", p.iteration_time_s},
        {"energy_j", p.energy_j},
        {"chunks", p.chunks},
        {"stages", nlohmann::json::array()}};
    for (const auto& st : p.stages) {
      nlohmann::json sj = {
          {"stage", st.stage}, {"end_s", st.end_s}, {"instructions", nlohmann::json::array()}};
      sj["dp_collectives"] = nlohmann::json::array();
      for (const auto& d : st.dp_collectives) {
        sj["dp_collectives"].push_back({{"collective", d.collective},
                                        {"chunk", d.chunk},
                                        {"start_s", d.start_s},
                                        {"end_s", d.end_s}});
      }
      for (const auto& in : st.instructions) {
        sj["instructions"].push_back(instruction_json(in, p.clock_switch_s, p.chunks > 1));
        fmin = fmin == 0 ? in.freq_mhz : std::min(fmin, in.freq_mhz);
        fmax = std::max(fmax, in.freq_mhz);
      }
      pj["stages"].push_back(std::move(sj));
    }
    j["panels"].push_back(std::move(pj));
  }
  // A single clock still needs a scale of some width for the colour bar.
  j["min_freq_mhz"] = fmin == fmax ? fmin - 100 : fmin;
  j["max_freq_mhz"] = fmax;
  return j;
}

namespace {

// The plotting script, written next to the picture so a user can re-run or restyle it.
const char* kTimelineScript = kareus_script_plot_timeline;

}  // namespace

bool plot_timeline(const std::vector<TimelinePanel>& panels, const std::string& png_path,
                   std::string& error) {
  const nlohmann::json data = timeline_data(panels);
  const std::string stem = std::filesystem::path(png_path).stem().string();
  return detail::run_plot_script(kTimelineScript, "plot_timeline.py", data, stem + ".data.json",
                                 png_path, error);
}

}  // namespace kareus
