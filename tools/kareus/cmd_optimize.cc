// `kareus optimize FILE --out DIR`: the whole pipeline and every baseline for one workload,
// writing frontier.json, plans/, report.md and frontier.png.
// `kareus eval --suite paper|DIR`: the same for every workload of a suite, in parallel.
#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "kareus/error.h"
#include "kareus/evaluate.h"
#include "kareus/frontier_file.h"
#include "kareus/interrupt.h"
#include "planner_flags.h"

namespace kareus::cli {
namespace {

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  if (!out) throw InvalidInput(fmt::format("{}: cannot write", p.string()));
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidInput(fmt::format("{}: cannot read", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::filesystem::path make_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw InvalidInput(fmt::format("--out {}: cannot create directory ({})", dir, ec.message()));
  return dir;
}

/// What `optimize` writes in its --out folder (a trailing '/' marks a folder): checked, with the
/// folder, before any work.
const std::vector<std::string> kOptimizeOutputs = {
    "frontier.json",           "report.md", "frontier.png", "plot_frontier.py",
    "frontier_plot_data.json", "plans/",    "timelines/"};

/// The flags of `kareus optimize`, owned by the subcommand's callback.
struct OptimizeArgs {
  std::string file, out;
  PlannerFlags flags;
  bool json = false;
};

/// The flags of `kareus eval`.
struct EvalArgs {
  std::string suite = "paper", out, report_out;
  int jobs = 2;
  bool json = false;
  PlannerFlags flags;
};

}  // namespace

void register_optimize(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "optimize", "Run the whole pipeline and the baselines; write frontier, plans, report, plot");
  auto args = std::make_shared<OptimizeArgs>();
  cmd->add_option("FILE", args->file, "workload YAML file")->required();
  cmd->add_option("--out", args->out, "output directory (created if missing)")->required();
  cmd->add_flag("--json", args->json, "print the evaluation as JSON instead of the table");
  add_planner_flags(cmd, args->flags);
  cmd->callback([&action, args] {
    action = [args] {
      const std::string& file = args->file;
      const std::string& out = args->out;
      const PlannerFlags& flags = args->flags;
      const bool json = args->json;
      check_planner_flags(flags);
      check_output("--out", out, OutputKind::kFolder, kOptimizeOutputs);
      const Workload w = load_job(file);
      PlannerProfiling session = open_planner_profiling(flags, w);
      const auto dir = make_dir(out);
      PipelineProgress progress(!flags.quiet);
      const WorkloadEvaluation e =
          evaluate_workload(w, *session.full.cached, session.options, progress.callback(), true,
                            session.screen_profiler());
      progress.finish();
      make_dir((dir / "plans").string());
      for (const auto& [name, p] : e.plans)
        save_plan(p, (dir / "plans" / (name + ".json")).string());
      // Every method's frontier as choices of options, and what `plan --from` needs to
      // materialize and check them (frontier_file.h).
      nlohmann::json fj = to_json(e, false);
      fj.update(e.frontier_plans);
      PlannerOptions used = session.options;
      used.focus_clocks_mhz = e.focus_clocks_mhz;  // what the last round's searches measured
      add_frontier_identity(fj, w, read_text(file), used);
      write_file(dir / "frontier.json", frontier_file_text(fj));
      std::string plot_error;
      const bool plotted = plot_frontiers(e, (dir / "frontier.png").string(), plot_error);
      std::string timeline_error;
      const auto timelines = plot_plan_timelines(e, dir.string(), "timelines", timeline_error);
      std::string report = workload_report(e, plotted ? "frontier.png" : "", timelines);
      if (!plotted) report += "\n(no plot: " + plot_error + ")\n";
      if (!timeline_error.empty()) report += "\n(no timeline: " + timeline_error + ")\n";
      write_file(dir / "report.md", report);
      if (json) {
        std::cout << to_json(e, true).dump(2) << "\n";
        return 0;
      }
      std::cout << fmt::format(
          "{} ({} GPUs, emulated): {} configurations profiled\nprofiling them on real GPUs: "
          "{}\n\n",
          e.workload, e.gpus, e.measured + e.reused, e.profiling_cost.describe());
      std::cout << comparison_table(e) << "\n";
      std::cout << fmt::format(
          "iso-time: {:.1f}% less energy than Perseus; iso-energy: {:.1f}% less time; "
          "max-throughput: {:.1f}% less time and {:.1f}% less energy than Megatron-LM\n",
          e.iso_time_energy_saving_pct, e.iso_energy_time_saving_pct,
          e.max_throughput_time_saving_pct, e.max_throughput_energy_saving_pct);
      if (!e.iso_time_note.empty()) std::cout << "iso-time: " << e.iso_time_note << "\n";
      if (e.fallback) std::cout << "fallback: " << e.fallback_note << "\n";
      for (const auto& l : e.own_losses) {
        std::cout << fmt::format(
            "Kareus's own frontier vs {}: {}\n", display_name(method_from_string(l.baseline)),
            l.lost == 0 ? fmt::format("never loses ({} deadlines compared)", l.deadlines)
                        : fmt::format("loses at {} of {} deadlines ({:.3f}..{:.3f} s), by up to "
                                      "{:.2f}% energy",
                                      l.lost, l.deadlines, l.from_s, l.to_s, l.worst_excess_pct));
      }
      for (const auto& n : e.notes) std::cout << "note: " << n << "\n";
      std::cout << fmt::format(
          "\nwrote {}/{{report.md, frontier.json, frontier.png, plans/, timelines/}}\n",
          dir.string());
      if (!plotted) std::cerr << "kareus: warning: " << plot_error << "\n";
      if (!timeline_error.empty()) std::cerr << "kareus: warning: " << timeline_error << "\n";
      return 0;
    };
  });
}

namespace {

// The workload files of a suite: `paper` (workloads/paper) or every *.yaml file of a folder,
// sorted by name.
std::vector<std::string> suite_files(const std::string& suite) {
  namespace fs = std::filesystem;
  const std::string dir = suite == "paper" ? shipped_path("workloads/paper") : suite;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InvalidInput(fmt::format(
        "--suite {}: no such folder; allowed: paper or a folder of workload *.yaml files", suite));
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".yaml" && e.is_regular_file()) files.push_back(e.path().string());
  }
  if (files.empty()) {
    throw InvalidInput(
        fmt::format("--suite {}: the folder {} has no *.yaml workload file", suite, dir));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Evaluates every workload on `jobs` threads; rethrows the first workload's error with its
// name, keeping its kind (invalid input stays exit 2).
std::vector<WorkloadEvaluation> evaluate_all(const std::vector<Workload>& workloads,
                                             const EvalArgs& a) {
  std::vector<WorkloadEvaluation> results(workloads.size());
  std::vector<std::exception_ptr> errors(workloads.size());
  std::atomic<std::size_t> next{0}, done{0};
  std::mutex mu;
  Progress bar("eval", workloads.size(), !a.flags.quiet);
  auto worker = [&] {
    for (std::size_t i = next++; i < workloads.size(); i = next++) {
      try {
        PlannerProfiling s = open_planner_profiling(a.flags, workloads[i]);
        // No display per workload, but every step checks for a stop request (SIGINT/SIGTERM).
        const PlannerProgress poll = [](const std::string&, std::size_t, std::size_t) {
          throw_if_interrupted();
        };
        results[i] = evaluate_workload(workloads[i], *s.full.cached, s.options, poll, false,
                                       s.screen_profiler());
      } catch (...) {
        errors[i] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      bar.update(++done);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(a.jobs, static_cast<int>(workloads.size())); ++t)
    pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  bar.finish();
  // A stop request ends every worker: report it as such (exit 128 + signal), not as the
  // failure of one workload.
  for (const auto& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const Interrupted&) {
      throw;
    } catch (...) {
    }
  }
  for (std::size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    const std::string& name = workloads[i].name;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const InvalidInput& e) {
      throw InvalidInput(fmt::format("{}: {}", name, e.what()));
    } catch (const NotSupported& e) {
      throw NotSupported(fmt::format("{}: {}", name, e.what()));
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: {}", name, e.what()));
    }
  }
  return results;
}

int run_eval(const EvalArgs& a) {
  check_planner_flags(a.flags);
  if (!a.out.empty()) check_output("--out", a.out, OutputKind::kFile);
  if (!a.report_out.empty()) check_output("--report", a.report_out, OutputKind::kFile);
  std::vector<Workload> workloads;
  for (const auto& f : suite_files(a.suite)) workloads.push_back(load_job(f));
  // One open in this thread first: a bad --db fails here, before any worker starts.
  if (!a.flags.profiling.db.empty()) open_profiling(a.flags.profiling, workloads.front());
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<WorkloadEvaluation> results = evaluate_all(workloads, a);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json j = nlohmann::json::array();
  for (const auto& e : results) j.push_back(to_json(e, false));
  const std::string report = suite_report(results, seconds);
  if (!a.report_out.empty()) write_file(a.report_out, report);
  const std::string text = a.json ? j.dump(1) + "\n" : report;
  if (a.out.empty()) {
    std::cout << text;
  } else {
    write_file(a.out, text);
    std::cout << fmt::format("wrote {}\n", a.out);
  }
  return 0;
}

}  // namespace

void register_eval(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("eval", "Evaluate a suite of workloads against the baselines");
  auto args = std::make_shared<EvalArgs>();
  cmd->add_option("--suite", args->suite,
                  "paper (workloads/paper) or a folder: every *.yaml workload file in it")
      ->capture_default_str();
  cmd->add_option("--jobs", args->jobs, "workloads evaluated in parallel")
      ->capture_default_str()
      ->check(integer_in(1, 256, "threads"));
  cmd->add_flag("--json", args->json, "results as JSON (one object per workload), not Markdown");
  cmd->add_option("--out", args->out, "write the results to this file instead of stdout");
  cmd->add_option("--report", args->report_out, "also write the Markdown report to this file");
  add_planner_flags(cmd, args->flags);
  cmd->callback([&action, args] { action = [args] { return run_eval(*args); }; });
}

}  // namespace kareus::cli
