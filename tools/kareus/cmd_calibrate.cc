// `kareus calibrate FILE --csv CALIBRATION.csv [--slow-freq MHZ] [--json]`: fits the emulator's
// fitted parameters to measured whole-iteration figures and prints them with the residuals.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kareus/calibrate.h"
#include "kareus/table.h"

namespace kareus::cli {

void register_calibrate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Fit the emulator to measured iteration time and energy (one workload)");
  static std::string file, csv;
  static int slow_freq = 1020;
  static bool json = false;
  cmd->add_option("FILE", file, "workload the measurements belong to")->required();
  cmd->add_option("--csv", csv, "calibration CSV (method,iter_time_s,energy_j)")->required();
  cmd->add_option("--slow-freq", slow_freq, "clock assigned to the slowest perseus row (MHz)")
      ->capture_default_str();
  cmd->add_flag("--json", json, "machine-readable output");
  cmd->callback([&action] {
    action = [] {
      const Workload w = load_workload(file);
      const auto targets = read_calibration_targets(csv, w.gpu().max_freq_mhz, slow_freq);
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
