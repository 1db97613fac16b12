import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.load(open(sys.argv[1]))
fig, ax = plt.subplots(figsize=(8, 5.5))
styles = [("kareus", "Kareus", "C3", "o"), ("nanobatch_perseus", "Nanobatching + Perseus", "C0", "s"),
          ("perseus", "Perseus (Megatron-LM + Perseus)", "C2", "^"),
          ("kareus_max_clock", "Kareus w/o frequency scaling", "C1", "d")]
for key, label, color, marker in styles:
    pts = data[key]
    if not pts:
        continue
    t = [p["iteration_time_s"] for p in pts]
    e = [p["energy_j"] / 1e3 for p in pts]
    ax.plot(t, e, color=color, marker=marker, markersize=3, linewidth=1.5, label=label)
for key, label, color, marker in [("megatron", "Megatron-LM", "k", "*"), ("nanobatch", "Nanobatching", "C4", "X")]:
    p = data[key]
    ax.plot([p["iteration_time_s"]], [p["energy_j"] / 1e3], linestyle="none", color=color,
            marker=marker, markersize=12, label=label)
first = True
for m in data["marked"]:
    x, y = m["iteration_time_s"], m["energy_j"] / 1e3
    if m["kind"] == "plan":
        ax.plot([x], [y], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                markeredgecolor="C3", markeredgewidth=1.8,
                label="written plan (plans/*.json)" if first else None)
        first = False
    else:
        ax.plot([x], [y], linestyle="none", marker="o", markersize=9, markerfacecolor="none",
                markeredgecolor="0.3", markeredgewidth=1.0)
fig.canvas.draw()
placed = []
for m in data["marked"]:
    x, y = m["iteration_time_s"], m["energy_j"] / 1e3
    dy, dx = 10, 9
    while True:
        a = ax.annotate(m["label"], (x, y), xytext=(dx, dy), textcoords="offset points",
                        ha="left" if dx > 0 else "right", fontsize=7.5,
                        color="C3" if m["kind"] == "plan" else "0.25",
                        fontweight="bold" if m["kind"] == "plan" else "normal",
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none",
                                  alpha=0.85),
                        arrowprops=dict(arrowstyle="-", color="0.5", linewidth=0.6))
        box = a.get_window_extent(fig.canvas.get_renderer()).expanded(1.05, 1.15)
        if dx > 0 and box.x1 > ax.bbox.x1:  # would leave the axes: put it on the left
            a.remove()
            dx, dy = -9, -16  # below-left: the curves arrive from the upper left
            continue
        if not any(box.overlaps(b) for b in placed) or dy < -120:
            placed.append(box)
            break
        a.remove()
        dy -= 11
ax.set_xlabel("Iteration time (s)")
ax.set_ylabel("Energy per iteration, whole job (kJ)")
pm = data["power_model"]
ax.set_title(data["workload"] + " (emulated; power model " +
             ("calibrated" if pm["calibrated"] else "NOT calibrated: estimate") + ")")
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8, loc="upper right")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=150)
