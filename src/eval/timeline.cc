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
const char* kTimelineScript = R"PY(import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import cm, colors
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import ScaledTranslation

data = json.load(open(sys.argv[1]))
panels = data["panels"]
rows = max(len(p["stages"]) for p in panels)
fig, axes = plt.subplots(len(panels), 1, squeeze=False, sharex=True, layout="constrained",
                         figsize=(11, 1.6 + len(panels) * (0.75 * rows + 0.9)))
norm = colors.Normalize(vmin=data["min_freq_mhz"], vmax=data["max_freq_mhz"])
cmap = plt.get_cmap("viridis")
tmax = max(p["iteration_time_s"] for p in panels)
labels = []
for ax, panel in zip(axes[:, 0], panels):
    ticks, names = [], []
    bars = {"stall": ([], [], []), "run": ([], [], []), "lane": ([], [], []),
            "dp": ([], [], [])}
    run_colors = []
    for row in panel["stages"]:
        y = rows - 1 - row["stage"]  # stage 0 on top
        for ins in row["instructions"]:
            if ins["stall_s"] > 0:
                for v, b in zip((y + 0.12, ins["stall_s"], ins["start_s"]), bars["stall"]):
                    b.append(v)
            run = ins["end_s"] - ins["run_start_s"]
            rgba = cmap(norm(ins["freq_mhz"]))
            for v, b in zip((y + 0.12, run, ins["run_start_s"]), bars["run"]):
                b.append(v)
            run_colors.append(rgba)
            dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
            labels.append((ax, ins["run_start_s"], ins["end_s"], y + 0.12, ins["label"],
                           "white" if dark else "black"))
            if ins["overlapped"]:
                for v, b in zip((y - 0.3, run, ins["run_start_s"]), bars["lane"]):
                    b.append(v)
        for d in row.get("dp_collectives", []):
            for v, b in zip((y - 0.42, d["end_s"] - d["start_s"], d["start_s"]), bars["dp"]):
                b.append(v)
        ticks.append(y + 0.12)
        names.append("stage %d" % row["stage"])
    # Rectangles as one PolyCollection per kind: barh makes one patch per bar, which takes
    # seconds for the thousand bars of a large job.
    def rects(ys, ws, ls, h):
        return [[(l, y - h / 2), (l + w, y - h / 2), (l + w, y + h / 2), (l, y + h / 2)]
                for y, w, l in zip(ys, ws, ls)]
    ax.add_collection(PolyCollection(rects(*bars["stall"], 0.56), facecolors="0.85",
                                     hatch="////", edgecolors="0.45", linewidths=0.3))
    ax.add_collection(PolyCollection(rects(*bars["run"], 0.56), facecolors=run_colors,
                                     edgecolors="white", linewidths=0.6))
    ax.add_collection(PolyCollection(rects(*bars["lane"], 0.16), facecolors="C3",
                                     edgecolors="white", linewidths=0.4))
    ax.add_collection(PolyCollection(rects(*bars["dp"], 0.1), facecolors="C1",
                                     edgecolors="white", linewidths=0.4))
    ax.set_yticks(ticks)
    ax.set_yticklabels(names)
    ax.set_ylim(-0.55, rows - 0.3)
    ax.set_xlim(0, tmax * 1.01)
    ax.axvline(panel["iteration_time_s"], color="k", linestyle="--", linewidth=0.8)
    note = "" if panel["execution"] == "overlapped" else \
        " - sequential: collectives run inside the bars, nothing overlaps"
    ax.set_title("%s: %.3f s, %.4g kJ per iteration%s" % (
        panel["title"], panel["iteration_time_s"], panel["energy_j"] / 1e3, note),
        fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
axes[-1, 0].set_xlabel("Time from the iteration start (s); F3/B3 = forward/backward of micro-batch 3"
                       + ("; F3c1 = through model chunk 1 (interleaved 1F1B)"
                          if any(p.get("chunks", 1) > 1 for p in panels) else ""))
fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes[:, 0].tolist(),
             label="SM clock (MHz)", fraction=0.03, pad=0.01)
handles = [Patch(facecolor="C3", label="other nano-batch's collectives overlapped (thin lane)"),
           Patch(facecolor="0.85", hatch="////", edgecolor="0.45", label="clock-switch stall"),
           Line2D([0], [0], color="k", linestyle="--", linewidth=0.8, label="iteration end")]
if any(row.get("dp_collectives") for p in panels for row in p["stages"]):
    handles.insert(1, Patch(facecolor="C1", label="data-parallel gradient reduce-scatter / "
                            "parameter all-gather (lowest lane)"))
# Below the x label (constrained layout makes room for an axes legend).
below = axes[-1, 0].transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans)
axes[-1, 0].legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0),
                   bbox_transform=below, ncol=3, fontsize=8, frameon=False)
fig.canvas.draw()  # settles the layout, so bar widths in pixels are final
# A label only where it fits inside its bar; its width is estimated from its length (7 pt
# characters are at most about 0.62 em wide) instead of measuring thousands of Text objects.
char_px = 0.62 * 7 * fig.dpi / 72
for ax, x0, x1, y, text, color in labels:
    px = ax.transData.transform([(x0, y), (x1, y)])
    if len(text) * char_px <= 0.9 * (px[1][0] - px[0][0]):
        ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=7, color=color)
fig.savefig(sys.argv[2], dpi=150)
)PY";

}  // namespace

bool plot_timeline(const std::vector<TimelinePanel>& panels, const std::string& png_path,
                   std::string& error) {
  const nlohmann::json data = timeline_data(panels);
  const std::string stem = std::filesystem::path(png_path).stem().string();
  return detail::run_plot_script(kTimelineScript, "plot_timeline.py", data, stem + ".data.json",
                                 png_path, error);
}

}  // namespace kareus
