// `kareus optimize FILE --out DIR`: the whole pipeline and every baseline for one workload,
// writing frontier.json, plans/, report.md and frontier.png.
// `kareus eval --suite paper`: the same for the paper's 14 workloads, in parallel.
#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "kareus/error.h"
#include "kareus/evaluate.h"
#include "planner_flags.h"

namespace kareus::cli {
namespace {

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  if (!out) throw InvalidInput(fmt::format("{}: cannot write", p.string()));
  out << text;
}

std::filesystem::path make_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw InvalidInput(fmt::format("--out {}: cannot create directory ({})", dir, ec.message()));
  return dir;
}

}  // namespace

void register_optimize(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "optimize", "Run the whole pipeline and the baselines; write frontier, plans, report, plot");
  static std::string file, out;
  static PlannerFlags flags;
  static bool json = false;
  cmd->add_option("FILE", file, "workload YAML file")->required();
  cmd->add_option("--out", out, "output directory")->required();
  cmd->add_flag("--json", json, "print the evaluation as JSON instead of the table");
  add_planner_flags(cmd, flags);
  cmd->callback([&action] {
    action = [] {
      const Workload w = load_workload(file);
      const auto dir = make_dir(out);
      ProfilingSession session = open_profiling(flags.profiling, w);
      PipelineProgress progress(!flags.quiet);
      const WorkloadEvaluation e =
          evaluate_workload(w, *session.cached, flags.planner, progress.callback(), true);
      progress.finish();
      make_dir((dir / "plans").string());
      for (const auto& [name, p] : e.plans)
        save_plan(p, (dir / "plans" / (name + ".json")).string());
      nlohmann::json fj = to_json(e, false);
      fj["points"] = e.frontier_plans;  // every point of Kareus's frontier with its plan
      write_file(dir / "frontier.json", fj.dump(1) + "\n");
      std::string plot_error;
      const bool plotted = plot_frontiers(e, (dir / "frontier.png").string(), plot_error);
      std::string report = workload_report(e, plotted ? "frontier.png" : "");
      if (!plotted) report += "\n(no plot: " + plot_error + ")\n";
      write_file(dir / "report.md", report);
      if (json) {
        std::cout << to_json(e, true).dump(2) << "\n";
        return 0;
      }
      std::cout << fmt::format(
          "{} ({} GPUs, emulated): {} configurations profiled, {:.1f} GPU-hours "
          "on real hardware\n\n",
          e.workload, e.gpus, e.measured + e.reused, e.real_gpu_hours);
      std::cout << comparison_table(e) << "\n";
      std::cout << fmt::format(
          "iso-time: {:.1f}% less energy than Perseus; iso-energy: {:.1f}% less time; "
          "max-throughput: {:.1f}% less time and {:.1f}% less energy than Megatron-LM\n",
          e.iso_time_energy_saving_pct, e.iso_energy_time_saving_pct,
          e.max_throughput_time_saving_pct, e.max_throughput_energy_saving_pct);
      if (e.fallback) std::cout << "fallback: " << e.fallback_note << "\n";
      std::cout << fmt::format("\nwrote {}/{{report.md, frontier.json, frontier.png, plans/}}\n",
                               dir.string());
      if (!plotted) std::cerr << "kareus: warning: " << plot_error << "\n";
      return 0;
    };
  });
}

void register_eval(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("eval", "Evaluate a suite of workloads against the baselines");
  static std::string suite = "paper", json_out, report_out;
  static int jobs = 2;
  static PlannerFlags flags;
  cmd->add_option("--suite", suite, "workload suite: paper (workloads/paper)")
      ->capture_default_str();
  cmd->add_option("--jobs", jobs, "workloads evaluated in parallel")->capture_default_str();
  cmd->add_option("--json", json_out, "write the results as JSON");
  cmd->add_option("--report", report_out, "write the results as Markdown");
  add_planner_flags(cmd, flags);
  cmd->callback([&action] {
    action = [] {
      if (suite != "paper")
        throw InvalidInput(fmt::format("--suite '{}': available: paper", suite));
      if (jobs < 1) throw InvalidInput(fmt::format("--jobs must be >= 1, got {}", jobs));
      // Workload files live next to the binary's source tree or the current directory.
      std::vector<std::string> files;
      for (const std::string& root :
           {std::string("workloads/paper"), std::string(KAREUS_SOURCE_DIR) + "/workloads/paper"}) {
        if (!std::filesystem::is_directory(root)) continue;
        for (const auto& e : std::filesystem::directory_iterator(root)) {
          if (e.path().extension() == ".yaml") files.push_back(e.path().string());
        }
        break;
      }
      if (files.empty()) throw InvalidInput("suite 'paper': workloads/paper not found");
      std::sort(files.begin(), files.end());
      std::vector<Workload> workloads;
      for (const auto& f : files) workloads.push_back(load_workload(f));
      std::vector<WorkloadEvaluation> results(workloads.size());
      std::vector<std::string> errors(workloads.size());
      std::atomic<std::size_t> next{0}, done{0};
      std::mutex mu;
      Progress bar("eval", workloads.size(), !flags.quiet);
      const auto t0 = std::chrono::steady_clock::now();
      auto worker = [&] {
        for (std::size_t i = next++; i < workloads.size(); i = next++) {
          try {
            ProfilingSession s = open_profiling(flags.profiling, workloads[i]);
            results[i] = evaluate_workload(workloads[i], *s.cached, flags.planner);
          } catch (const std::exception& ex) {
            errors[i] = ex.what();
          }
          std::lock_guard<std::mutex> lock(mu);
          bar.update(++done);
        }
      };
      std::vector<std::thread> pool;
      for (int t = 0; t < std::min<int>(jobs, static_cast<int>(workloads.size())); ++t)
        pool.emplace_back(worker);
      for (auto& t : pool) t.join();
      bar.finish();
      for (std::size_t i = 0; i < errors.size(); ++i) {
        if (!errors[i].empty()) throw Error(fmt::format("{}: {}", workloads[i].name, errors[i]));
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::json j = nlohmann::json::array();
      for (const auto& e : results) j.push_back(to_json(e, false));
      const std::string report = suite_report(results, seconds);
      if (!json_out.empty()) write_file(json_out, j.dump(1) + "\n");
      if (!report_out.empty()) write_file(report_out, report);
      std::cout << report;
      return 0;
    };
  });
}

}  // namespace kareus::cli
