// `kareus emulate FILE --schedule megatron|nanobatch --freq MHZ [--json]`: whole-iteration
// emulation of a reference schedule at a uniform clock.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/evaluate.h"
#include "kareus/plan.h"
#include "kareus/replan.h"
#include "kareus/table.h"

namespace kareus::cli {

nlohmann::json iteration_json(const IterationResult& r) {
  nlohmann::json j;
  j["iteration_time_s"] = r.iteration_time_s;
  j["energy_j"] = r.energy_j;
  j["energy_j_per_gpu_sum_over_stages"] = r.energy_j_per_gpu_sum_over_stages();
  j["stages"] = nlohmann::json::array();
  for (const auto& s : r.stages) {
    j["stages"].push_back({{"stage", s.stage},
                           {"energy_j_per_gpu", s.energy_j_per_gpu},
                           {"dynamic_energy_j_per_gpu", s.dynamic_energy_j_per_gpu},
                           {"busy_time_s", s.busy_time_s},
                           {"clock_changes", s.clock_changes},
                           {"instructions", nlohmann::json::array()}});
    for (const auto& t : s.instructions) {
      j["stages"].back()["instructions"].push_back({{"instruction", to_string(t.kind)},
                                                    {"microbatch", t.microbatch},
                                                    {"freq_mhz", t.freq_mhz},
                                                    {"clock_switch", t.clock_switch},
                                                    {"start_s", t.start_s},
                                                    {"end_s", t.end_s}});
    }
  }
  return j;
}

std::string iteration_text(const IterationResult& r) {
  std::string out = fmt::format("iteration time {:.4f} s, energy {:.1f} J (whole job)\n",
                                r.iteration_time_s, r.energy_j);
  TextTable t({"stage", "energy per GPU (J)", "dynamic (J)", "busy (s)", "clock changes",
               "average power (W)"});
  for (const auto& s : r.stages) {
    t.add_row({std::to_string(s.stage), fmt::format("{:.1f}", s.energy_j_per_gpu),
               fmt::format("{:.1f}", s.dynamic_energy_j_per_gpu),
               fmt::format("{:.4f}", s.busy_time_s), std::to_string(s.clock_changes),
               fmt::format("{:.1f}", s.energy_j_per_gpu / r.iteration_time_s)});
  }
  return out + t.render();
}

int check_freq(const GpuSpec& g, int freq_mhz, const char* flag) {
  if (!g.supports_freq(freq_mhz)) {
    throw InvalidInput(fmt::format("{} {}: {} supports {}..{} MHz in {} MHz steps", flag, freq_mhz,
                                   g.name, g.min_freq_mhz, g.max_freq_mhz, g.freq_step_mhz));
  }
  return freq_mhz;
}

void register_emulate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("emulate",
                                 "Emulate a whole training iteration under a reference schedule");
  // Owned by the subcommand's callback.
  struct Args {
    std::string file, schedule = "megatron", plan_file;
    std::vector<std::string> stage_slowdown;
    int freq = 0;
    double switch_ms = -1;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("FILE", args->file, "workload YAML file")->required();
  cmd->add_option("--schedule", args->schedule, "megatron (sequential kernels) or nanobatch")
      ->capture_default_str()
      ->check(CLI::IsMember({"megatron", "nanobatch"}));
  cmd->add_option("--freq", args->freq, "uniform SM clock in MHz (default: the GPU's maximum)")
      ->check(integer_in(1, 100000, "MHz"));
  cmd->add_option("--plan", args->plan_file,
                  "replay a plan (per-instruction clocks and partition settings) instead");
  cmd->add_option("--stage-slowdown", args->stage_slowdown,
                  "with --plan: STAGE=FACTOR, that stage's instructions take FACTOR times as "
                  "long at the same dynamic energy (a straggler; repeat for several stages)");
  cmd->add_option("--clock-switch-ms", args->switch_ms,
                  "stall per SM-clock change between instructions (default: the GPU's catalogue "
                  "value)")
      ->check(finite_in(0, false, 1e4, "milliseconds"));
  cmd->add_flag("--json", args->json, "machine-readable output");
  cmd->callback([&action, args] {
    action = [args] {
      const std::string& schedule = args->schedule;
      const std::string& plan_file = args->plan_file;
      const int freq = args->freq;
      const double switch_ms = args->switch_ms;
      if (!plan_file.empty()) check_input_file("--plan", plan_file);
      const Workload w = load_job(args->file);
      const EmulatorModel m(w.gpu());
      IterationResult r;
      if (!plan_file.empty()) {
        // Validated against the workload: every violation names the plan's field (exit 2).
        const Plan p = load_plan(plan_file, w);
        const double switch_s = switch_ms < 0 ? w.gpu().clock_switch_s : switch_ms * 1e-3;
        r = emulate_iteration(
            w, m, p.execution,
            [&p](int s, InstructionKind k, int mb) { return p.settings(s, k, mb); }, switch_s,
            args->stage_slowdown.empty()
                ? std::vector<double>{}
                : parse_stage_slowdowns(args->stage_slowdown, w.parallel.pp, "--stage-slowdown"));
      } else {
        if (!args->stage_slowdown.empty()) {
          throw InvalidInput("--stage-slowdown: needs --plan PLAN (it slows a plan's stages)");
        }
        const int f = freq == 0 ? w.gpu().max_freq_mhz : check_freq(w.gpu(), freq, "--freq");
        r = emulate_schedule(w, m, schedule, f);
      }
      if (args->json) {
        nlohmann::json j = iteration_json(r);
        j["power_model"] = power_model_json(w.gpu());
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << iteration_text(r) << power_model_text(w.gpu());
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
