import json, sys
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
