// `kareus profile`: measure one configuration of a partition, or sweep every configuration of
// one or all partitions into the profile store, with progress and the real-GPU cost.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kareus/error.h"
#include "kareus/progress.h"
#include "kareus/search_space.h"
#include "profiling_flags.h"

namespace kareus::cli {
namespace {

nlohmann::json measurement_json(const Measurement& m) {
  return {{"time_s", m.time_s},
          {"energy_j", m.energy_j},
          {"dynamic_energy_j", m.dynamic_energy_j},
          {"static_energy_j", m.static_energy_j}};
}

}  // namespace

void register_profile(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "profile", "Measure a partition at one configuration, or sweep all configurations");
  static std::string file, partition, slot;
  static int freq = -1, sms = -1;
  static bool sweep = false, json = false, quiet = false;
  static ProfilingFlags flags;
  cmd->add_option("FILE", file, "workload YAML file")->required();
  cmd->add_option("--partition", partition, "partition key (see `kareus workload show`)");
  cmd->add_option("--freq", freq, "SM clock in MHz");
  cmd->add_option("--sms", sms, "SMs (CTAs) given to the collective");
  cmd->add_option("--slot", slot, "launch slot of the collective");
  cmd->add_flag("--sweep", sweep, "measure every configuration (all partitions by default)");
  cmd->add_flag("--json", json, "machine-readable output");
  cmd->add_flag("--quiet", quiet, "no progress bar");
  add_profiling_flags(cmd, flags);
  cmd->callback([&action] {
    action = [] {
      const Workload w = load_workload(file);
      const PartitionSet ps = partition_workload(w);
      ProfilingSession session = open_profiling(flags, w);
      const GpuSpec& gpu = session.backend->gpu();
      if (!sweep) {
        if (partition.empty() || freq < 0 || sms < 0 || slot.empty()) {
          throw InvalidInput(
              "profile needs --partition KEY --freq MHZ --sms N --slot NAME (or --sweep)");
        }
        const Partition& p = ps.partition(partition);
        const PartitionConfig c{freq, sms, slot};
        validate_config(p, gpu, c);
        const Measurement m = session.cached->measure(p, c);
        if (json) {
          std::cout << measurement_json(m).dump(2) << "\n";
        } else {
          std::cout << fmt::format(
              "{} at {} MHz, {} SMs, slot {}: {:.6f} s, {:.3f} J ({:.3f} J dynamic, {:.3f} J "
              "static)\n",
              p.key, freq, sms, slot, m.time_s, m.energy_j, m.dynamic_energy_j, m.static_energy_j);
        }
        return 0;
      }
      if (flags.db.empty()) throw InvalidInput("--sweep needs --db PATH to keep its measurements");
      std::vector<const Partition*> targets;
      if (partition.empty()) {
        for (const auto& p : ps.partitions) targets.push_back(&p);
      } else {
        targets.push_back(&ps.partition(partition));
      }
      std::size_t total = 0;
      std::vector<SearchSpace> spaces;
      for (const Partition* p : targets) {
        spaces.push_back(make_search_space(*p, gpu));
        total += spaces.back().size();
      }
      Progress bar("profiling", total, !quiet);
      std::size_t done = 0;
      for (std::size_t i = 0; i < targets.size(); ++i) {
        for (const auto& c : spaces[i].configs()) {
          session.cached->measure(*targets[i], c);
          bar.update(++done);
        }
      }
      bar.finish();
      const double real_s = static_cast<double>(total) * kRealSecondsPerPoint;
      if (json) {
        nlohmann::json j = {{"configs", total},
                            {"measured", session.cached->measured()},
                            {"reused", session.cached->reused()},
                            {"real_gpu_time_s", real_s},
                            {"db", flags.db}};
        for (std::size_t i = 0; i < targets.size(); ++i) {
          j["partitions"].push_back({{"key", targets[i]->key}, {"configs", spaces[i].size()}});
        }
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << fmt::format(
            "{} configurations of {} partition(s): {} measured now, {} already in {}\n"
            "on real GPUs this sweep would take {} of profiling (5 s window + 5 s cool-down per "
            "point, whole node)\n",
            total, targets.size(), session.cached->measured(), session.cached->reused(), flags.db,
            format_duration(real_s));
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
