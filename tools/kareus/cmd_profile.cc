// `kareus profile`: measure one configuration of a partition, or sweep every configuration of
// one or all partitions into the profile store, with progress and the real-GPU cost; measure
// the listed points of an ask/tell file (`--points`, appending trace rows with `--append`); or
// measure the static power of the workload's GPUs (`--static-power`).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "kareus/error.h"
#include "kareus/evaluate.h"
#include "kareus/profiling_cost.h"
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

constexpr const char* kPointsHeader = "partition,freq_mhz,sms,slot";
constexpr const char* kTraceHeader = "partition,freq_mhz,sms,slot,time_s,energy_j";

struct PointRow {
  std::string name;  ///< partition key, or segment name[@stage/instruction]
  PartitionConfig config;
};

// Reads an ask/tell points file: header partition,freq_mhz,sms,slot (extra trailing columns,
// such as a trace's time_s,energy_j, are ignored so a trace can be re-measured).
std::vector<PointRow> read_points(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidInput(fmt::format("--points {}: cannot open the file", path));
  std::vector<PointRow> rows;
  std::string line;
  int lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      if (line.rfind(kPointsHeader, 0) != 0) {
        throw InvalidInput(fmt::format("{}:{}: header must start with '{}', got '{}'", path, lineno,
                                       kPointsHeader, line));
      }
      header = true;
      continue;
    }
    std::stringstream ss(line);
    std::string name, f, sms, slot;
    if (!std::getline(ss, name, ',') || !std::getline(ss, f, ',') || !std::getline(ss, sms, ',') ||
        !std::getline(ss, slot, ',') || name.empty() || slot.empty()) {
      throw InvalidInput(
          fmt::format("{}:{}: expected the columns {}", path, lineno, kPointsHeader));
    }
    PointRow r;
    r.name = name;
    r.config.slot = slot;
    try {
      std::size_t a = 0, b = 0;
      r.config.freq_mhz = std::stoi(f, &a);
      r.config.sms = std::stoi(sms, &b);
      if (a != f.size() || b != sms.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw InvalidInput(fmt::format("{}:{}: freq_mhz and sms must be integers, got '{}' and '{}'",
                                     path, lineno, f, sms));
    }
    rows.push_back(r);
  }
  if (!header) throw InvalidInput(fmt::format("--points {}: empty file (no header)", path));
  return rows;
}

// A segment by its trace name: "name@stage/instruction" or a bare name (its first instance).
const Segment* find_segment(const PartitionSet& ps, const std::string& name) {
  for (const auto& s : ps.segments) {
    if (name == fmt::format("{}@{}/{}", s.name, s.stage, s.instruction)) return &s;
  }
  for (const auto& s : ps.segments) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

// Opens the trace to append to, writing the header when the file is new or empty and checking
// it otherwise.
std::ofstream open_append(const std::string& path) {
  std::error_code ec;
  const bool fresh =
      !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
  if (!fresh) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      if (line != kTraceHeader) {
        throw InvalidInput(
            fmt::format("--append {}: header must be '{}', got '{}'", path, kTraceHeader, line));
      }
      break;
    }
  }
  std::ofstream out(path, std::ios::app);
  if (!out) throw InvalidInput(fmt::format("--append {}: cannot write the file", path));
  if (fresh) out << kTraceHeader << "\n";
  return out;
}

/// The flags of `kareus profile`, owned by the subcommand's callback.
struct ProfileArgs {
  std::string file, partition, slot, points, append;
  int freq = -1, sms = -1;
  bool sweep = false, json = false, quiet = false, static_power = false;
  ProfilingFlags flags;
};

/// The store `profile --sweep` fills when no --db is given (the one `make run` reuses).
constexpr const char* kDefaultSweepDb = "out/profiles.db";

}  // namespace

void register_profile(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "profile", "Measure a partition at one configuration, or sweep all configurations");
  auto args = std::make_shared<ProfileArgs>();
  ProfileArgs& a = *args;
  cmd->add_option("FILE", a.file, "workload YAML file")->required();
  cmd->add_option("--partition", a.partition, "partition key (see `kareus workload show`)");
  // Bounded while parsing, so a value beyond int says its limit instead of "Could not convert";
  // the GPU's own clocks are checked once the workload is loaded.
  cmd->add_option("--freq", a.freq, "SM clock in MHz")->check(integer_in(1, 100000, "MHz"));
  // 0 (the copy engines) only where the partition allows it: validate_config says so.
  cmd->add_option("--sms", a.sms,
                  "SMs (CTAs) given to the collective; 0: the copy engines, where the "
                  "partition's all-to-alls allow them")
      ->check(integer_in(kCopyEngineSms, kMaxCollectiveSms, "SMs"));
  cmd->add_option("--slot", a.slot, "launch slot of the collective");
  cmd->add_flag("--sweep", a.sweep,
                fmt::format("measure every configuration (all partitions by default) into the "
                            "--db store (default {})",
                            kDefaultSweepDb));
  cmd->add_option("--points", a.points,
                  "measure the points listed in this CSV (partition,freq_mhz,sms,slot), e.g. the "
                  "file `search --ask` wrote");
  cmd->add_option("--append", a.append,
                  "with --points: append trace rows (partition,freq_mhz,sms,slot,time_s,energy_j) "
                  "to this CSV instead of printing them");
  cmd->add_flag("--static-power", a.static_power,
                "measure the static power of the workload's GPUs (the emulator and the trace "
                "return the catalogue value)");
  cmd->add_flag("--json", a.json, "machine-readable output");
  cmd->add_flag("--quiet", a.quiet, "no progress bar");
  add_profiling_flags(cmd, a.flags);
  cmd->callback([&action, args] {
    action = [args] {
      const std::string& file = args->file;
      const std::string& partition = args->partition;
      const std::string& slot = args->slot;
      const std::string& points = args->points;
      const std::string& append = args->append;
      const int freq = args->freq, sms = args->sms;
      const bool sweep = args->sweep, json = args->json, quiet = args->quiet;
      const bool static_power = args->static_power;
      ProfilingFlags& flags = args->flags;
      if (static_cast<int>(sweep) + static_cast<int>(static_power) +
              static_cast<int>(!points.empty()) >
          1) {
        throw InvalidInput("profile: choose one of --sweep, --points, --static-power");
      }
      if (!append.empty() && points.empty()) throw InvalidInput("--append needs --points FILE");
      if (!points.empty()) check_input_file("--points", points);
      if (!append.empty()) check_output("--append", append, OutputKind::kFile);
      if (sweep && flags.db.empty()) {
        // The store a sweep fills is what later runs reuse: default to the one `make run` uses
        // (its folder is created, as for every --db).
        flags.db = kDefaultSweepDb;
      }
      check_profiling_flags(flags);
      const Workload w = load_job(file);
      const PartitionSet ps = partition_workload(w);
      ProfilingSession session = open_profiling(flags, w);
      const GpuSpec& gpu = session.backend->gpu();
      if (static_power) {
        const double p_w = session.backend->measure_static_power_w();
        if (json) {
          std::cout << nlohmann::json{{"gpu", gpu.name},
                                      {"backend", session.backend->name()},
                                      {"static_power_w", p_w},
                                      {"catalogue_static_power_w", gpu.static_power_w},
                                      {"catalogue_estimated", gpu.static_power_estimated}}
                           .dump(2)
                    << "\n";
        } else {
          std::cout << fmt::format(
              "static power of {} (backend {}): {:.1f} W per GPU (catalogue {:.1f} W{})\n",
              gpu.display_name, session.backend->name(), p_w, gpu.static_power_w,
              gpu.static_power_estimated ? ", an estimate" : "");
        }
        return 0;
      }
      if (!points.empty()) {
        const auto rows = read_points(points);
        std::vector<Measurement> ms;
        Progress bar("profiling points", rows.size(), !quiet && !append.empty());
        for (const auto& r : rows) {
          const Partition* p = nullptr;
          for (const auto& q : ps.partitions) {
            if (q.key == r.name) p = &q;
          }
          if (p) {
            validate_config(*p, gpu, r.config);
            ms.push_back(session.cached->measure(*p, r.config));
          } else if (const Segment* s = find_segment(ps, r.name)) {
            if (r.config.sms != 0 || r.config.slot != "-" ||
                !gpu.supports_freq(r.config.freq_mhz)) {
              throw InvalidInput(fmt::format(
                  "--points {}: segment row {} needs a supported clock, sms 0 and slot '-'", points,
                  r.name));
            }
            ms.push_back(session.cached->measure_segment(*s, r.config.freq_mhz));
          } else {
            throw InvalidInput(fmt::format(
                "--points {}: '{}' is neither a partition nor a segment of {} (see `kareus "
                "workload show`)",
                points, r.name, file));
          }
          bar.update(ms.size());
        }
        bar.finish();
        if (json) {
          nlohmann::json j = nlohmann::json::array();
          for (std::size_t i = 0; i < rows.size(); ++i) {
            j.push_back({{"partition", rows[i].name},
                         {"freq_mhz", rows[i].config.freq_mhz},
                         {"sms", rows[i].config.sms},
                         {"slot", rows[i].config.slot},
                         {"time_s", ms[i].time_s},
                         {"energy_j", ms[i].energy_j}});
          }
          if (append.empty()) std::cout << j.dump(2) << "\n";
        }
        // Shortest round-trip formatting: a trace read back gives the very same doubles.
        std::string csv;
        for (std::size_t i = 0; i < rows.size(); ++i) {
          csv += fmt::format("{},{},{},{},{},{}\n", rows[i].name, rows[i].config.freq_mhz,
                             rows[i].config.sms, rows[i].config.slot, ms[i].time_s, ms[i].energy_j);
        }
        if (!append.empty()) {
          std::ofstream out = open_append(append);
          out << csv;
          out.close();
          if (!out) throw InvalidInput(fmt::format("--append {}: write failed", append));
          if (json) {
            std::cout << nlohmann::json{{"measured", rows.size()}, {"appended_to", append}}.dump(2)
                      << "\n";
          } else {
            std::cout << fmt::format("{} point(s) measured with {}, appended to {}\n", rows.size(),
                                     session.backend->name(), append);
          }
        } else if (!json) {
          std::cout << kTraceHeader << "\n" << csv;
        }
        return 0;
      }
      if (!sweep) {
        if (partition.empty() || freq < 0 || sms < 0 || slot.empty()) {
          throw InvalidInput(
              "profile needs --partition KEY --freq MHZ --sms N --slot NAME (or --sweep)");
        }
        const Partition& p = ps.partition(partition);
        const PartitionConfig c{freq, sms, slot};
        validate_config(p, gpu, c);
        const Measurement m = session.cached->measure(p, c);
        // Emulated energies say whether the GPU's power model is calibrated.
        const bool emulated = flags.backend == "emulator";
        if (json) {
          nlohmann::json j = measurement_json(m);
          if (emulated) j["power_model"] = power_model_json(gpu);
          std::cout << j.dump(2) << "\n";
        } else {
          std::cout << fmt::format(
              "{} at {} MHz, {} SMs, slot {}: {:.6f} s, {:.3f} J ({:.3f} J dynamic, {:.3f} J "
              "static)\n",
              p.key, freq, sms, slot, m.time_s, m.energy_j, m.dynamic_energy_j, m.static_energy_j);
          if (emulated) std::cout << power_model_text(gpu);
        }
        return 0;
      }
      std::vector<const Partition*> targets;
      if (partition.empty()) {
        for (const auto& p : ps.partitions) targets.push_back(&p);
      } else {
        targets.push_back(&ps.partition(partition));
      }
      std::size_t total = 0;
      std::vector<SearchSpace> spaces;
      for (const Partition* p : targets) {
        spaces.push_back(make_search_space(*p, gpu, space_options(*session.backend)));
        total += spaces.back().size();
      }
      Progress bar("profiling", total, !quiet);
      std::size_t done = 0;
      for (std::size_t i = 0; i < targets.size(); ++i) {
        // One batch per partition: with --mpi every measuring rank works on it at once.
        session.cached->measure_batch(*targets[i], spaces[i].configs(),
                                      [&](std::size_t, const Measurement&) { bar.update(++done); });
      }
      bar.finish();
      const ProfilingCostEstimate cost = estimate_profiling_cost(total, w.cluster.gpus_per_node);
      if (json) {
        nlohmann::json j = {{"configs", total},
                            {"measured", session.cached->measured()},
                            {"reused", session.cached->reused()},
                            {"real_gpu_time_s", cost.wall_s()},
                            {"cost_estimate", cost.to_json()},
                            {"db", flags.db}};
        for (std::size_t i = 0; i < targets.size(); ++i) {
          j["partitions"].push_back({{"key", targets[i]->key}, {"configs", spaces[i].size()}});
        }
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << fmt::format(
            "{} configurations of {} partition(s): {} measured now, {} already in {}\n"
            "on real GPUs this sweep would take {}\n",
            total, targets.size(), session.cached->measured(), session.cached->reused(), flags.db,
            cost.describe());
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
