// `kareus monitor merge FILE... [--json] [--plan PLAN --workload FILE]`: the per-rank files of
// the runtime's energy monitor (include/kareus/monitor.h) merged into the job's per-iteration
// table (time: max over the ranks, energy: sum, W/GPU), totals, and with a plan the comparison
// with its prediction. Text and JSON come from one MergeReport.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "kareus/metrics.h"
#include "kareus/monitor.h"
#include "kareus/plan.h"
#include "kareus/plan_check.h"
#include "kareus/table.h"

namespace kareus::cli {
namespace {

using runtime::JobRun;

struct MergeArgs {
  std::vector<std::string> files;
  bool json = false;
  std::string plan;
  std::string workload;
};

/// What the plan predicts for the merged ranks, per iteration.
struct Prediction {
  std::string plan;
  int gpus = 0;  ///< the plan's whole job
  double iteration_time_s = 0;
  double energy_j = 0;  ///< the merged ranks' GPUs (Plan::gpu_energy_j of each)
  double avg_power_per_gpu_w = 0;
  std::optional<double> energy_per_token_j;  ///< the whole job's, with every rank merged
};

struct MergeReport {
  JobRun run;
  std::optional<int> job_gpus;                 ///< from the workload
  std::optional<double> tokens_per_iteration;  ///< from the workload
  std::optional<Prediction> prediction;
  std::vector<std::string> notes;

  bool every_rank() const { return job_gpus && static_cast<int>(run.files.size()) == *job_gpus; }
  /// The job's measured J/token: only with the workload and every rank's file.
  std::optional<double> energy_per_token_j() const {
    const auto e = run.energy_per_iteration_j();
    if (!e || !tokens_per_iteration || !every_rank()) return std::nullopt;
    return *e / *tokens_per_iteration;
  }
};

nlohmann::json or_null(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::optional<double> relative_error(const std::optional<double>& measured,
                                     const std::optional<double>& predicted) {
  if (!measured || !predicted || !(*predicted > 0)) return std::nullopt;
  return *measured / *predicted - 1;
}

/// Each rank's stage against the plan's layout: a file of another job is refused, naming it.
Prediction predict(const Plan& p, const std::string& path, const JobRun& run) {
  Prediction pr;
  pr.plan = path;
  pr.gpus = p.layout.gpus();
  pr.iteration_time_s = p.iteration_time_s;
  for (const auto& f : run.files) {
    const std::string where = fmt::format("{}:{}", f.path, f.lines.front());
    if (f.rank >= p.layout.gpus()) {
      throw InvalidInput(fmt::format("{}: field 'rank': {}: the plan {} has ranks 0..{}", where,
                                     f.rank, path, p.layout.gpus() - 1));
    }
    if (const int s = p.stage_of_rank(f.rank); s != f.stage) {
      throw InvalidInput(fmt::format("{}: field 'stage': {}: the plan {} puts rank {} in stage {}",
                                     where, f.stage, path, f.rank, s));
    }
    pr.energy_j += p.gpu_energy_j(f.stage);
  }
  pr.avg_power_per_gpu_w =
      pr.energy_j / (pr.iteration_time_s * static_cast<double>(run.files.size()));
  return pr;
}

MergeReport build_report(const MergeArgs& a) {
  MergeReport r;
  r.run = runtime::merge_monitor_files(a.files);
  r.notes = r.run.notes;
  std::optional<Workload> w;
  if (!a.workload.empty()) {
    w = load_workload(a.workload);
    const JobShape job = job_shape(*w);
    r.job_gpus = job.gpus;
    r.tokens_per_iteration = job.tokens_per_iteration;
    if (!r.every_rank()) {
      r.notes.push_back(fmt::format("J/token needs every rank's file: {} of the job's {} given",
                                    r.run.files.size(), job.gpus));
    }
  }
  if (!a.plan.empty()) {
    const Plan p = load_plan(a.plan, *w);
    r.prediction = predict(p, a.plan, r.run);
    if (r.every_rank()) r.prediction->energy_per_token_j = p.energy_j / *r.tokens_per_iteration;
  }
  return r;
}

nlohmann::json report_json(const MergeReport& r) {
  const JobRun& run = r.run;
  nlohmann::json j;
  j["files"] = nlohmann::json::array();
  j["ranks"] = nlohmann::json::array();
  for (const auto& f : run.files) {
    j["files"].push_back(
        {{"path", f.path},
         {"rank", f.rank},
         {"stage", f.stage},
         {"gpu_uuid", f.gpu_uuid.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.gpu_uuid)},
         {"iterations", f.iterations.size()}});
    j["ranks"].push_back(f.rank);
  }
  j["stages"] = run.stages;
  j["iterations"] = nlohmann::json::array();
  for (const auto& it : run.iterations) {
    nlohmann::json busy = nlohmann::json::array();
    for (const auto& b : it.stage_busy_time_s) busy.push_back(or_null(b));
    j["iterations"].push_back({{"iteration", it.iteration},
                               {"time_s", it.time_s},
                               {"energy_j", or_null(it.energy_j)},
                               {"avg_power_per_gpu_w", or_null(it.avg_power_per_gpu_w)},
                               {"stage_busy_time_s", busy}});
  }
  nlohmann::json total = {{"iterations", run.iterations.size()},
                          {"time_s", run.time_s()},
                          {"energy_iterations", run.energy_iterations()},
                          {"energy_j", or_null(run.energy_j())},
                          {"time_per_iteration_s", or_null(run.time_per_iteration_s())},
                          {"energy_per_iteration_j", or_null(run.energy_per_iteration_j())},
                          {"avg_power_per_gpu_w", or_null(run.avg_power_per_gpu_w())}};
  if (r.tokens_per_iteration) {
    total["tokens_per_iteration"] = *r.tokens_per_iteration;
    total["energy_per_token_j"] = or_null(r.energy_per_token_j());
  }
  j["total"] = std::move(total);
  if (r.prediction) {
    const Prediction& p = *r.prediction;
    j["prediction"] = {{"plan", p.plan},
                       {"gpus", p.gpus},
                       {"iteration_time_s", p.iteration_time_s},
                       {"energy_per_iteration_j", p.energy_j},
                       {"avg_power_per_gpu_w", p.avg_power_per_gpu_w},
                       {"energy_per_token_j", or_null(p.energy_per_token_j)}};
    j["error"] = {
        {"iteration_time", or_null(relative_error(run.time_per_iteration_s(), p.iteration_time_s))},
        {"energy_per_iteration", or_null(relative_error(run.energy_per_iteration_j(), p.energy_j))},
        {"avg_power_per_gpu",
         or_null(relative_error(run.avg_power_per_gpu_w(), p.avg_power_per_gpu_w))},
        {"energy_per_token",
         or_null(relative_error(r.energy_per_token_j(), p.energy_per_token_j))}};
  }
  j["notes"] = r.notes;
  return j;
}

std::string cell(const std::optional<double>& v, const char* format) {
  return v ? fmt::format(fmt::runtime(format), *v) : "-";
}

std::string percent(const std::optional<double>& e) {
  return e ? fmt::format("{:+.1f}%", 100 * *e) : "-";
}

std::string report_text(const MergeReport& r) {
  const JobRun& run = r.run;
  std::string out = fmt::format(
      "{} rank{}{}, {} stage{}, {} iteration{}; per iteration: time = max over the ranks, "
      "energy = sum\n",
      run.files.size(), run.files.size() == 1 ? "" : "s",
      r.job_gpus ? fmt::format(" of the job's {}", *r.job_gpus) : "", run.stages,
      run.stages == 1 ? "" : "s", run.iterations.size(), run.iterations.size() == 1 ? "" : "s");
  std::vector<std::string> header = {"iteration", "time (s)", "energy (J)", "W/GPU"};
  for (int s = 0; s < run.stages; ++s) header.push_back(fmt::format("busy s{} (s)", s));
  TextTable t(header);
  for (const auto& it : run.iterations) {
    std::vector<std::string> row = {std::to_string(it.iteration), fmt::format("{:.4f}", it.time_s),
                                    cell(it.energy_j, "{:.1f}"),
                                    cell(it.avg_power_per_gpu_w, "{:.1f}")};
    for (const auto& b : it.stage_busy_time_s) row.push_back(cell(b, "{:.4f}"));
    t.add_row(std::move(row));
  }
  out += t.render();
  const auto per_token = r.energy_per_token_j();
  out += fmt::format("total: {:.4f} s, {}; per iteration: {} s, {} J, {} W/GPU{}\n", run.time_s(),
                     run.energy_j() ? format_energy(*run.energy_j()) : "no energy",
                     cell(run.time_per_iteration_s(), "{:.4f}"),
                     cell(run.energy_per_iteration_j(), "{:.1f}"),
                     cell(run.avg_power_per_gpu_w(), "{:.1f}"),
                     per_token ? fmt::format(", {:.4g} J/token", *per_token) : "");
  if (r.prediction) {
    const Prediction& p = *r.prediction;
    out += fmt::format(
        "predicted by {} for these {} GPUs: {:.4f} s, {:.1f} J, {:.1f} W/GPU{}\n", p.plan,
        run.files.size(), p.iteration_time_s, p.energy_j, p.avg_power_per_gpu_w,
        p.energy_per_token_j ? fmt::format(", {:.4g} J/token", *p.energy_per_token_j) : "");
    out += fmt::format("measured vs predicted: time {}, energy {}, W/GPU {}{}\n",
                       percent(relative_error(run.time_per_iteration_s(), p.iteration_time_s)),
                       percent(relative_error(run.energy_per_iteration_j(), p.energy_j)),
                       percent(relative_error(run.avg_power_per_gpu_w(), p.avg_power_per_gpu_w)),
                       p.energy_per_token_j
                           ? ", J/token " + percent(relative_error(per_token, p.energy_per_token_j))
                           : "");
  }
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  return out;
}

}  // namespace

void register_monitor(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("monitor", "Read the files of the runtime's energy monitor");
  cmd->require_subcommand(1);
  auto* merge = cmd->add_subcommand(
      "merge", "Merge per-rank energy-monitor files into the job's per-iteration figures");
  auto args = std::make_shared<MergeArgs>();
  merge->add_option("FILE", args->files, "one rank's monitor file (JSON lines), one per rank")
      ->required();
  merge->add_flag("--json", args->json, "machine-readable result (docs/formats.md)");
  auto* plan = merge->add_option("--plan", args->plan,
                                 "compare with this plan's prediction (needs --workload)");
  auto* workload = merge->add_option("--workload", args->workload,
                                     "the job's workload file: GPU count and tokens for J/token");
  plan->needs(workload);
  merge->callback([&action, args] {
    action = [args] {
      const MergeReport r = build_report(*args);
      if (args->json) {
        std::cout << report_json(r).dump(2) << "\n";
      } else {
        std::cout << report_text(r);
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
