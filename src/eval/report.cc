// What a person reads of an evaluation: the comparison table (time, energy, tokens/s, MFU,
// energy per token, power per GPU; metrics.h), the workload and suite reports, the frontier plot
// with the written plans marked, and the plans' timelines (timeline.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "kareus/evaluate.h"
#include "kareus/table.h"
#include "kareus/timeline.h"
#include "plot.h"
#include "plot_frontier_script.h"

namespace kareus {
namespace {

// Change of `value` against `base` in percent, without "-0.0%".
double change_pct(double base, double value) {
  const double v = 100.0 * (value - base) / base;
  return v == 0 ? 0.0 : v;
}

const FrontierSummaryPoint& fastest(const std::vector<FrontierSummaryPoint>& v) {
  return max_throughput_point(v);
}

const FrontierSummaryPoint& cheapest(const std::vector<FrontierSummaryPoint>& v) {
  return *std::min_element(v.begin(), v.end(),
                           [](const auto& a, const auto& b) { return a.energy_j < b.energy_j; });
}

// The rows of the comparison table: method, plan, point. Kareus's rows carry the label of the
// method whose plan they are ("Kareus (Perseus plan)" where it fell back); the rows "Kareus own"
// are its own frontier without the fallback.
struct Row {
  std::string method;
  std::string plan;
  FrontierSummaryPoint point;
};

std::vector<Row> comparison_rows(const WorkloadEvaluation& e) {
  auto kareus = [](const FrontierSummaryPoint& p) { return kareus_plan_label(p.method); };
  std::vector<Row> rows = {{"Megatron-LM", "max clock", e.megatron},
                           {"Nanobatching", "max clock", e.nanobatch},
                           {"Perseus", "fastest", fastest(e.perseus)},
                           {"Perseus", "min energy", cheapest(e.perseus)},
                           {"Nanobatching+Perseus", "fastest", fastest(e.nanobatch_perseus)},
                           {"Nanobatching+Perseus", "min energy", cheapest(e.nanobatch_perseus)},
                           {kareus(fastest(e.kareus)), "fastest", fastest(e.kareus)},
                           {kareus(e.iso_time_point), "iso-time", e.iso_time_point},
                           {kareus(e.iso_energy_point), "iso-energy", e.iso_energy_point},
                           {kareus(cheapest(e.kareus)), "min energy", cheapest(e.kareus)}};
  if (e.fallback) {
    // The merged rows above include baseline plans: show Kareus's own frontier beside them.
    rows.push_back({"Kareus own", "fastest", fastest(e.kareus_only)});
    if (e.own_has_iso_time) rows.push_back({"Kareus own", "iso-time", e.own_iso_time_point});
    rows.push_back({"Kareus own", "min energy", cheapest(e.kareus_only)});
  }
  rows.push_back({"Kareus w/o freq. scaling", "fastest", fastest(e.kareus_max_clock)});
  return rows;
}

// One line under every table of emulated energies: whether the GPU's power model is calibrated.
std::string power_model_line(const WorkloadEvaluation& e) {
  if (e.power_calibrated) return fmt::format("power model: calibrated ({})\n", e.power_source);
  return fmt::format("power model: NOT calibrated: {}\n", e.power_caveat);
}

}  // namespace

std::string comparison_table(const WorkloadEvaluation& e) {
  TextTable t({"method", "plan", "time (s)", "energy", "time vs Megatron", "energy vs Megatron",
               "tokens/s", "per GPU", "MFU", "energy/token", "W/GPU"});
  for (const Row& r : comparison_rows(e)) {
    const FrontierSummaryPoint& p = r.point;
    const ThroughputMetrics m = e.metrics(p);
    t.add_row({r.method, r.plan, fmt::format("{:.3f}", p.iteration_time_s),
               format_energy(p.energy_j, 4),
               fmt::format("{:+.1f}%", change_pct(e.megatron.iteration_time_s, p.iteration_time_s)),
               fmt::format("{:+.1f}%", change_pct(e.megatron.energy_j, p.energy_j)),
               format_si(m.tokens_per_s), format_si(m.tokens_per_s_per_gpu),
               fmt::format("{:.1f}%", 100 * m.mfu), format_energy(m.energy_per_token_j),
               fmt::format("{:.0f}", m.avg_power_per_gpu_w)});
  }
  return t.render() + power_model_line(e);
}

namespace {

std::string metrics_table(const WorkloadEvaluation& e) {
  std::string s = "| metric | this run | paper (best case, OSDI '26) |\n| --- | --- | --- |\n";
  s += fmt::format("| iso-time energy saving vs Perseus | {:.2f}% | up to {}% |\n",
                   e.iso_time_energy_saving_pct, PaperHeadline::iso_time_energy_saving_pct);
  s += fmt::format("| iso-time energy saving vs Perseus, Kareus's own frontier only | {} | - |\n",
                   e.own_has_iso_time ? fmt::format("{:.2f}%", e.own_iso_time_energy_saving_pct)
                                      : std::string("no own plan that fast"));
  if (!e.iso_time_note.empty()) s += fmt::format("| iso-time caveat | {} | - |\n", e.iso_time_note);
  s += fmt::format("| iso-energy time saving vs Perseus | {:.2f}% | up to {}% |\n",
                   e.iso_energy_time_saving_pct, PaperHeadline::iso_energy_time_saving_pct);
  s += fmt::format("| max-throughput time saving vs Megatron-LM | {:.2f}% | up to {}% |\n",
                   e.max_throughput_time_saving_pct, PaperHeadline::max_throughput_time_saving_pct);
  s += fmt::format("| max-throughput energy saving vs Megatron-LM | {:.2f}% | up to {}% |\n",
                   e.max_throughput_energy_saving_pct,
                   PaperHeadline::max_throughput_energy_saving_pct);
  s += fmt::format("| energy increase without frequency scaling | {:.2f}% | - |\n",
                   e.ablation_no_freq_energy_increase_pct);
  s += fmt::format("| energy increase without kernel scheduling | {:.2f}% | {}% |\n",
                   e.ablation_no_sched_energy_increase_pct,
                   PaperHeadline::ablation_no_sched_energy_increase_pct);
  return s;
}

// How the comparison table's metrics are defined, with this job's figures.
std::string metrics_definitions(const WorkloadEvaluation& e) {
  const JobShape& j = e.job;
  return fmt::format(
      "tokens/s: {} tokens per iteration (whole job) over the iteration time; per GPU: over {} "
      "GPUs. MFU: model FLOPs per iteration, {} (6 x the matmul weights each token multiplies, "
      "a MoE layer's top-k experts, plus causal attention at half the s x s square; Narayanan "
      "et al., SC '21, eq. 3, counts the full square; recomputed forwards are not counted), "
      "over iteration time x {} GPUs x {:.0f} TFLOP/s (the GPU's "
      "dense bf16 peak). energy/token: whole-job energy per iteration over its tokens. W/GPU: "
      "average power per GPU, static power included.\n\n",
      j.tokens_per_iteration, j.gpus, human_flops(j.model_flops_per_iteration), j.gpus,
      j.peak_flops_per_gpu / 1e12);
}

// Kareus's own frontier (without falling back to the baselines) against each baseline.
std::string own_frontier_section(const WorkloadEvaluation& e) {
  std::string s =
      "### Kareus's own frontier against the baselines\n\nWithout the fallback: at every deadline "
      "both frontiers can meet (each point time of either, from the later fastest time on), does "
      "Kareus's own least energy exceed the baseline's?\n\n"
      "| baseline | deadlines compared | Kareus loses at | worst energy excess | lost range (s) "
      "|\n| --- | --- | --- | --- | --- |\n";
  for (const auto& l : e.own_losses) {
    s += fmt::format("| {} | {} | {} | {:.2f}% | {} |\n",
                     display_name(method_from_string(l.baseline)), l.deadlines, l.lost,
                     l.worst_excess_pct,
                     l.lost ? fmt::format("{:.3f}..{:.3f}", l.from_s, l.to_s) : "-");
  }
  return s + "\n";
}

std::string replay_table(const WorkloadEvaluation& e) {
  std::string s =
      "| plan | predicted time (s) | emulated time (s) | error | predicted energy (J) | emulated "
      "energy (J) | error | whose plan |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& r : e.replays) {
    const auto plan = e.plans.find(r.plan);
    s += fmt::format("| {} | {:.4f} | {:.4f} | {:+.2f}% | {:.1f} | {:.1f} | {:+.2f}% | {} |\n",
                     r.plan, r.predicted_time_s, r.emulated_time_s, 100 * r.time_error(),
                     r.predicted_energy_j, r.emulated_energy_j, 100 * r.energy_error(),
                     plan == e.plans.end() ? "" : plan->second.label);
  }
  return s;
}

std::string timelines_section(const std::map<std::string, std::string>& timelines) {
  if (timelines.empty()) return "";
  std::string s =
      "## Timelines\n\nOne iteration of each written plan (top) and of Megatron-LM's (bottom): "
      "one row per pipeline stage, each instruction a bar coloured by its SM clock, clock-switch "
      "stalls hatched, and under each stage a thin lane where the other nano-batch's "
      "collectives run overlapped.\n\n";
  for (const auto& [plan, png] : timelines) s += fmt::format("- [{}]({})\n", plan, png);
  const auto shown = timelines.count("iso-time") ? timelines.find("iso-time") : timelines.begin();
  s += fmt::format("\n![{} plan and Megatron-LM over one iteration]({})\n\n", shown->first,
                   shown->second);
  return s;
}

}  // namespace

std::string workload_report(const WorkloadEvaluation& e, const std::string& png_name,
                            const std::map<std::string, std::string>& timelines) {
  std::string s = fmt::format("# Kareus report: {}\n\n", e.workload);
  s += "All numbers come from Kareus's embedded emulator (docs/emulator.md), not from GPUs. Energy "
       "is the whole job's (all " +
       std::to_string(e.gpus) +
       " GPUs) per training iteration, static "
       "energy included. Every method ran through the same composition and frontier solver on the "
       "same measurements.\n\n";
  s += e.power_calibrated
           ? fmt::format("Power model: calibrated for this GPU ({}).\n\n", e.power_source)
           : fmt::format("**Power model: NOT calibrated for this GPU.** {}\n\n", e.power_caveat);
  for (const auto& n : e.notes) s += fmt::format("**Note:** {}.\n\n", n);
  s += "## Profiling cost\n\n";
  s += fmt::format(
      "{} configurations profiled ({} measured in this run, {} from the profile store). On real "
      "GPUs: {}.\n\n",
      e.measured + e.reused, e.measured, e.reused, e.profiling_cost.describe());
  s += "| partition | configurations | searched |\n| --- | --- | --- |\n";
  for (const auto& p : e.searches)
    s += fmt::format("| {} | {} | {} |\n", p.key, p.space,
                     p.evaluations + p.coverage_points + p.completion_points);
  s += "\n## Comparison\n\n```\n" + comparison_table(e) + "```\n\n";
  s += metrics_definitions(e);
  s += metrics_table(e);
  s += fmt::format("\nfallback: {}{}\n\n", e.fallback ? "yes" : "no",
                   e.fallback ? " (" + e.fallback_note + ")" : "");
  s += own_frontier_section(e);
  if (!png_name.empty()) {
    s += fmt::format(
        "![time-energy frontiers]({})\n\nThe four written plans (`plans/`) are marked on "
        "Kareus's frontier; the baselines' fastest and least-energy plans on theirs.\n\n",
        png_name);
  }
  s += timelines_section(timelines);
  s += "## Plans and their replay\n\nEach plan is replayed by the whole-iteration emulation "
       "(`kareus emulate --plan`), independently of the composition that predicted it.\n\n";
  s += replay_table(e);
  return s;
}

namespace {

std::string savings_table(const std::vector<WorkloadEvaluation>& all) {
  std::string s =
      "| workload | iso-time energy saving | iso-energy time saving | max-throughput time saving "
      "| max-throughput energy saving | no freq. scaling | no scheduling | fallback | own frontier "
      "loses (vs Perseus / N+P) | power model |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  double sum[6] = {0}, best[6] = {-1e9, -1e9, -1e9, -1e9, -1e9, -1e9};
  for (const auto& e : all) {
    const double v[6] = {
        e.iso_time_energy_saving_pct,           e.iso_energy_time_saving_pct,
        e.max_throughput_time_saving_pct,       e.max_throughput_energy_saving_pct,
        e.ablation_no_freq_energy_increase_pct, e.ablation_no_sched_energy_increase_pct};
    std::string loses;
    for (const auto& l : e.own_losses) {
      loses +=
          (loses.empty() ? "" : " / ") +
          (l.lost ? fmt::format("{} of {} (up to {:.1f}%)", l.lost, l.deadlines, l.worst_excess_pct)
                  : std::string("never"));
    }
    s +=
        fmt::format("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {} | {} | {} |\n",
                    e.workload, v[0], v[1], v[2], v[3], v[4], v[5], e.fallback ? "yes" : "no",
                    loses, e.power_calibrated ? "calibrated" : "NOT calibrated");
    for (int k = 0; k < 6; ++k) {
      sum[k] += v[k];
      best[k] = std::max(best[k], v[k]);
    }
  }
  const double n = static_cast<double>(std::max<std::size_t>(1, all.size()));
  s += fmt::format("| **mean** | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | | | |\n",
                   sum[0] / n, sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, sum[5] / n);
  s += fmt::format("| **best** | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | | | |\n",
                   best[0], best[1], best[2], best[3], best[4], best[5]);
  s += fmt::format("| paper (up to) | {} | {} | {} | {} | - | {} | | | |\n\n",
                   PaperHeadline::iso_time_energy_saving_pct,
                   PaperHeadline::iso_energy_time_saving_pct,
                   PaperHeadline::max_throughput_time_saving_pct,
                   PaperHeadline::max_throughput_energy_saving_pct,
                   PaperHeadline::ablation_no_sched_energy_increase_pct);
  return s;
}

// Throughput and energy per token of Megatron-LM and of Kareus's iso-time plan, per workload.
std::string throughput_table(const std::vector<WorkloadEvaluation>& all) {
  std::string s =
      "| workload | GPUs | Megatron-LM tokens/s per GPU | MFU | energy/token | W/GPU | Kareus "
      "iso-time tokens/s per GPU | MFU | energy/token | W/GPU | profiling (estimate) |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& e : all) {
    const ThroughputMetrics a = e.metrics(e.megatron), b = e.metrics(e.iso_time_point);
    s += fmt::format(
        "| {} | {} | {} | {:.1f}% | {} | {:.0f} | {} | {:.1f}% | {} | {:.0f} | {:.1f} GPU-h |\n",
        e.workload, e.gpus, format_si(a.tokens_per_s_per_gpu), 100 * a.mfu,
        format_energy(a.energy_per_token_j), a.avg_power_per_gpu_w,
        format_si(b.tokens_per_s_per_gpu), 100 * b.mfu, format_energy(b.energy_per_token_j),
        b.avg_power_per_gpu_w, e.profiling_cost.gpu_hours());
  }
  return s;
}

}  // namespace

std::string suite_report(const std::vector<WorkloadEvaluation>& all, double seconds) {
  std::string s = "# Kareus evaluation\n\n";
  s += fmt::format(
      "{} workloads on the embedded emulator in {:.0f} s. Savings in percent; iso-time "
      "and iso-energy against Perseus, max-throughput against Megatron-LM; ablations "
      "are the energy increase at Perseus's fastest iteration time.\n\n",
      all.size(), seconds);
  s += savings_table(all);
  // Each uncalibrated GPU's caveat once, and each workload's notes.
  std::set<std::string> caveats;
  for (const auto& e : all) {
    if (!e.power_calibrated && caveats.insert(e.power_caveat).second) {
      s += fmt::format("**Power model NOT calibrated:** {}\n\n", e.power_caveat);
    }
    for (const auto& n : e.notes) s += fmt::format("**{}:** {}.\n\n", e.workload, n);
    if (!e.iso_time_note.empty()) s += fmt::format("**{}:** {}.\n\n", e.workload, e.iso_time_note);
  }
  s += "\"Own frontier loses\": at how many of the deadlines both can meet Kareus's own frontier "
       "(without falling back to a baseline's plan) needs more energy than Perseus / "
       "Nanobatching+Perseus, and by how much at worst.\n\n";
  s += "Throughput and energy per token (MFU: model FLOPs without recompute, causal attention at "
       "half, over the GPUs' dense bf16 peak; energy and power include static power). "
       "Profiling: the real-GPU cost estimate of each workload's measured configurations (5 s "
       "window + 5 s cool-down each, one node per measurement).\n\n";
  s += throughput_table(all) + "\n";
  double worst_replay = 0;
  for (const auto& e : all) {
    for (const auto& r : e.replays) {
      worst_replay = std::max({worst_replay, std::abs(r.time_error()), std::abs(r.energy_error())});
    }
  }
  s += fmt::format(
      "Every reported plan was replayed by the whole-iteration emulation; the largest "
      "deviation from its prediction was {:.2f}%.\n",
      100 * worst_replay);
  return s;
}

namespace {

// The plotting script, written next to the data so a user can re-run or restyle it. Marked
// points get a label each; labels that would overlap are pushed down until they do not.
const char* kPlotScript = kareus_script_plot_frontier;

nlohmann::json marked_json(const std::string& label, const std::string& kind, double time_s,
                           double energy_j) {
  return {{"label", label}, {"kind", kind}, {"iteration_time_s", time_s}, {"energy_j", energy_j}};
}

}  // namespace

bool plot_frontiers(const WorkloadEvaluation& e, const std::string& png_path, std::string& error) {
  nlohmann::json data = to_json(e, false);
  data["marked"] = nlohmann::json::array();
  for (const char* name : {"max-throughput", "iso-energy", "iso-time", "min-energy"}) {
    const auto it = e.plans.find(name);
    if (it == e.plans.end()) continue;
    const std::string label = it->second.label == "Kareus"
                                  ? std::string(name)
                                  : fmt::format("{} ({})", name, it->second.label);
    data["marked"].push_back(
        marked_json(label, "plan", it->second.iteration_time_s, it->second.energy_j));
  }
  // The baselines' fastest plans run at max clock nearly everywhere, so they usually coincide
  // with Megatron-LM's and Nanobatching's points, which the legend names: they get a label only
  // where they differ visibly.
  auto near = [](const FrontierSummaryPoint& a, const FrontierSummaryPoint& b) {
    return std::abs(a.iteration_time_s / b.iteration_time_s - 1) < 0.005 &&
           std::abs(a.energy_j / b.energy_j - 1) < 0.005;
  };
  std::vector<std::pair<std::string, FrontierSummaryPoint>> baselines;
  if (!near(fastest(e.perseus), e.megatron))
    baselines.emplace_back("Perseus fastest", fastest(e.perseus));
  baselines.emplace_back("Perseus min energy", cheapest(e.perseus));
  if (!near(fastest(e.nanobatch_perseus), e.nanobatch))
    baselines.emplace_back("Nanobatching+Perseus fastest", fastest(e.nanobatch_perseus));
  baselines.emplace_back("Nanobatching+Perseus min energy", cheapest(e.nanobatch_perseus));
  for (const auto& [label, p] : baselines) {
    data["marked"].push_back(marked_json(label, "baseline", p.iteration_time_s, p.energy_j));
  }
  return detail::run_plot_script(kPlotScript, "plot_frontier.py", data, "frontier_plot_data.json",
                                 png_path, error);
}

std::map<std::string, std::string> plot_plan_timelines(const WorkloadEvaluation& e,
                                                       const std::string& dir,
                                                       const std::string& subdir,
                                                       std::string& error) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> made;
  std::error_code ec;
  fs::create_directories(fs::path(dir) / subdir, ec);
  if (ec) {
    error = fmt::format("{}: cannot create ({})", (fs::path(dir) / subdir).string(), ec.message());
    return made;
  }
  for (const auto& [name, plan] : e.plans) {
    const std::string rel = (fs::path(subdir) / (name + ".timeline.png")).string();
    const std::vector<TimelinePanel> panels = {{fmt::format("{} {} plan", plan.label, name), &plan},
                                               {"Megatron-LM", &e.megatron_plan}};
    std::string why;
    if (plot_timeline(panels, (fs::path(dir) / rel).string(), why)) {
      made.emplace(name, rel);
    } else if (error.empty()) {
      error = why;
    }
  }
  return made;
}

}  // namespace kareus
