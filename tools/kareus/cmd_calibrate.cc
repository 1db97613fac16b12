// `kareus calibrate [CSV] [--workload FILE] [--slow-freq MHZ] [--json]`: fits the emulator's
// fitted parameters to measured whole-iteration figures and prints them with the residuals.
// Without arguments it refits the shipped calibration (data/calibration/), reproducing the
// committed defaults.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "kareus/calibrate.h"
#include "kareus/table.h"

namespace kareus::cli {
namespace {

/// The measurements shipped with Kareus and the workload they belong to (docs/emulator.md).
constexpr const char* kDefaultCsv =
    "data/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv";
constexpr const char* kDefaultWorkload = "workloads/paper/llama3.2-3b_tp8_mbs8_seq4096.yaml";

/// A default path names shipped data: found from the current directory or the source tree.
std::string shipped_default(const std::string& value, const char* default_value) {
  return value == default_value ? shipped_path(value) : value;
}

}  // namespace

void register_calibrate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Fit the emulator to measured iteration time and energy (one workload)");
  // Owned by the subcommand's callback.
  struct Args {
    std::string csv = kDefaultCsv, workload = kDefaultWorkload;
    int slow_freq = 1020;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("CSV", args->csv, "calibration CSV (method,iter_time_s,energy_j)")
      ->capture_default_str();
  cmd->add_option("--workload", args->workload, "workload the measurements belong to")
      ->capture_default_str();
  cmd->add_option("--slow-freq", args->slow_freq, "clock assigned to the slowest perseus row (MHz)")
      ->capture_default_str()
      ->check(integer_in(1, 100000, "MHz"));
  cmd->add_flag("--json", args->json, "machine-readable output");
  cmd->callback([&action, args] {
    action = [args] {
      const bool json = args->json;
      const std::string csv = shipped_default(args->csv, kDefaultCsv);
      check_input_file("CSV", csv);
      const Workload w = load_workload(shipped_default(args->workload, kDefaultWorkload));
      const auto targets = read_calibration_targets(csv, w.gpu().max_freq_mhz, args->slow_freq);
      const CalibrationResult r = calibrate(w, targets, calibration_prior());
      EmulatorParams p = r.params;
      auto fields = p.fields();
      if (json) {
        nlohmann::json j;
        for (const auto& name : r.fitted) j["fitted"][name] = *fields.at(name);
        for (const auto& x : r.residuals) {
          j["residuals"].push_back({{"target", x.target.label},
                                    {"measured_time_s", x.target.time_s},
                                    {"emulated_time_s", x.time_s},
                                    {"time_error", x.time_error},
                                    {"measured_energy_j", x.target.energy_j},
                                    {"emulated_energy_j", x.energy_j},
                                    {"energy_error", x.energy_error}});
        }
        j["rms_error"] = r.rms_error;
        j["evaluations"] = r.evaluations;
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      std::cout << fmt::format("fitted parameters ({} evaluations):\n", r.evaluations);
      for (const auto& name : r.fitted) {
        std::cout << fmt::format("  {:<20} {:.6g}\n", name, *fields.at(name));
      }
      TextTable t(
          {"target", "measured s", "emulated s", "error", "measured J", "emulated J", "error"});
      for (const auto& x : r.residuals) {
        t.add_row({x.target.label, fmt::format("{:.3f}", x.target.time_s),
                   fmt::format("{:.3f}", x.time_s), fmt::format("{:+.1f}%", 100 * x.time_error),
                   fmt::format("{:.1f}", x.target.energy_j), fmt::format("{:.1f}", x.energy_j),
                   fmt::format("{:+.1f}%", 100 * x.energy_error)});
      }
      std::cout << t.render() << fmt::format("rms relative error {:.2f}%\n", 100 * r.rms_error);
      return 0;
    };
  });
}

}  // namespace kareus::cli
