// `kareus calibrate [CSV] [--workload FILE] [--fit MODELS] [--no-fit] [--per-clock]
// [--json]`: fits the emulator's fitted parameters to measured whole-iteration figures and to the
// Perseus per-clock A100 stage profiles (data/calibration/), then prints the residuals of both,
// the profiles the fit saw apart from the held-out ones. Without arguments it refits the
// shipped calibration, reproducing the committed defaults (docs/emulator.md).
// `kareus calibrate --artifact DIR | --artifact-csv FILE [--only NAMES] [--write-csv FILE]`:
// the measured frontiers of the Kareus artifact against the emulated ones (fidelity.h), with
// the committed parameters; nothing is fitted.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_util.h"
#include "commands.h"
#include "kareus/artifact.h"
#include "kareus/calibrate.h"
#include "kareus/evaluate.h"
#include "kareus/fidelity.h"
#include "kareus/interrupt.h"
#include "kareus/progress.h"
#include "kareus/table.h"
#include "profiling_flags.h"

namespace kareus::cli {
namespace {

/// The measurements shipped with Kareus and the workload they belong to (docs/emulator.md).
constexpr const char* kDefaultCsv =
    "data/calibration/a100-sxm4-40gb_llama3.2-3b_tp8_pp2_mbs8_seq4096.csv";
constexpr const char* kDefaultWorkload = "workloads/paper/llama3.2-3b_tp8_mbs8_seq4096.yaml";
constexpr const char* kDefaultProfileDir = "data/calibration";
constexpr const char* kArtifactCsv = "data/calibration/artifact_frontiers.csv";

std::string pct(double x) { return fmt::format("{:+.1f}%", 100 * x); }

/// The artifact's Perseus and Nanobatching+Perseus frontiers as calibration cases, each workload
/// read from workloads/paper/.
std::vector<ArtifactCase> shipped_artifact_cases() {
  const std::string csv = shipped_path(kArtifactCsv);
  check_input_file("artifact CSV", csv);
  return artifact_cases(read_artifact_csv(csv), [](const std::string& name) {
    const std::string path = shipped_path("workloads/paper/" + name + ".yaml");
    check_input_file("workload of artifact " + name, path);
    return load_workload(path);
  });
}

nlohmann::json artifact_residuals_json(const std::vector<ArtifactResidual>& rs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rs) {
    a.push_back({{"workload", r.workload},
                 {"method", r.method},
                 {"set", r.fit ? "fit" : "held-out"},
                 {"measured_fastest_time_s", r.measured.fastest_time_s},
                 {"emulated_fastest_time_s", r.emulated.fastest_time_s},
                 {"time_error", r.time_error},
                 {"measured_energy_at_fastest_j", r.measured.energy_at_fastest_j},
                 {"emulated_energy_at_fastest_j", r.emulated.energy_at_fastest_j},
                 {"energy_at_fastest_error", r.energy_at_fastest_error},
                 {"measured_least_energy_j", r.measured.least_energy_j},
                 {"emulated_least_energy_j", r.emulated.least_energy_j},
                 {"least_energy_error", r.least_energy_error}});
  }
  return a;
}

std::string artifact_residuals_text(const std::vector<ArtifactResidual>& rs) {
  TextTable t({"workload", "set", "method", "fastest s meas", "emu", "error", "J at fastest meas",
               "emu", "error", "least J meas", "emu", "error"});
  double worst_fit = 0, worst_held = 0;
  for (const auto& r : rs) {
    t.add_row({r.workload, r.fit ? "fit" : "held-out", r.method,
               fmt::format("{:.3f}", r.measured.fastest_time_s),
               fmt::format("{:.3f}", r.emulated.fastest_time_s), pct(r.time_error),
               fmt::format("{:.1f}", r.measured.energy_at_fastest_j),
               fmt::format("{:.1f}", r.emulated.energy_at_fastest_j),
               pct(r.energy_at_fastest_error), fmt::format("{:.1f}", r.measured.least_energy_j),
               fmt::format("{:.1f}", r.emulated.least_energy_j), pct(r.least_energy_error)});
    double& worst = r.fit ? worst_fit : worst_held;
    for (double e : {r.time_error, r.energy_at_fastest_error, r.least_energy_error}) {
      worst = std::max(worst, std::abs(e));
    }
  }
  return "\nKareus artifact frontier ends (no search: every instruction at the top clock, or at "
         "its own least-energy clock):\n" +
         t.render() +
         fmt::format("worst |error|: fit {:.1f}%, held-out {:.1f}%\n", 100 * worst_fit,
                     100 * worst_held);
}

/// A default path names shipped data: found from the current directory or the source tree.
std::string shipped_default(const std::string& value, const char* default_value) {
  return value == default_value ? shipped_path(value) : value;
}

std::string profile_path(const std::string& dir, const std::string& model) {
  return fmt::format("{}/perseus_stage-profile_{}_a100-sxm_bf16.csv", dir, model);
}

nlohmann::json profile_json(const StageProfileResult& r) {
  nlohmann::json j;
  j["model"] = r.model;
  j["norm_time_rms"] = r.norm_time_rms;
  j["power_rms"] = r.power_rms;
  for (const auto& x : r.rows) {
    j["rows"].push_back({{"stage", x.measured.stage},
                         {"instruction", to_string(x.measured.kind)},
                         {"freq_mhz", x.measured.freq_mhz},
                         {"measured_time_s", x.measured.time_s},
                         {"emulated_time_s", x.emulated_time_s},
                         {"measured_norm_time", x.measured_norm_time},
                         {"emulated_norm_time", x.emulated_norm_time},
                         {"norm_time_error", x.norm_time_error},
                         {"measured_power_w", x.measured_power_w},
                         {"emulated_power_w", x.emulated_power_w},
                         {"power_error", x.power_error}});
  }
  return j;
}

/// Per instruction: RMS and worst error over the clocks; then per clock: RMS over instructions.
std::string profile_text(const StageProfileResult& r, const std::string& part, bool per_clock) {
  std::string out =
      fmt::format("{} stage profile ({}): normalized time RMS {:.2f}%, power RMS {:.2f}%\n",
                  r.model, part, 100 * r.norm_time_rms, 100 * r.power_rms);
  struct Acc {
    double t2 = 0, p2 = 0, tmax = 0, pmax = 0, p_top_meas = 0, p_top_emu = 0;
    int n = 0;
  };
  std::map<std::pair<int, int>, Acc> by_inst;
  std::map<int, Acc, std::greater<int>> by_clock;
  int top = 0;
  for (const auto& x : r.rows) top = std::max(top, x.measured.freq_mhz);
  for (const auto& x : r.rows) {
    for (Acc* a : {&by_inst[{x.measured.stage, static_cast<int>(x.measured.kind)}],
                   &by_clock[x.measured.freq_mhz]}) {
      a->t2 += x.norm_time_error * x.norm_time_error;
      a->p2 += x.power_error * x.power_error;
      if (std::abs(x.norm_time_error) > std::abs(a->tmax)) a->tmax = x.norm_time_error;
      if (std::abs(x.power_error) > std::abs(a->pmax)) a->pmax = x.power_error;
      a->p_top_meas += x.measured_power_w;
      a->p_top_emu += x.emulated_power_w;
      ++a->n;
    }
  }
  TextTable t({"stage", "instruction", "time RMS", "time worst", "power RMS", "power worst"});
  for (const auto& [key, a] : by_inst) {
    t.add_row({std::to_string(key.first), to_string(static_cast<InstructionKind>(key.second)),
               fmt::format("{:.2f}%", 100 * std::sqrt(a.t2 / a.n)), pct(a.tmax),
               fmt::format("{:.2f}%", 100 * std::sqrt(a.p2 / a.n)), pct(a.pmax)});
  }
  out += t.render();
  TextTable c({"MHz", "norm. time RMS", "mean measured W", "mean emulated W", "power RMS"});
  for (const auto& [f, a] : by_clock) {
    if (!per_clock && f % 90 != top % 90 && f != top) continue;  // every 90 MHz unless asked
    c.add_row({std::to_string(f), fmt::format("{:.2f}%", 100 * std::sqrt(a.t2 / a.n)),
               fmt::format("{:.0f}", a.p_top_meas / a.n), fmt::format("{:.0f}", a.p_top_emu / a.n),
               fmt::format("{:.2f}%", 100 * std::sqrt(a.p2 / a.n))});
  }
  return out + c.render();
}

struct DevicePart {
  std::string label;
  std::vector<DeviceRow> rows;
  double time_rms = 0, power_rms = 0;
};

DevicePart device_part(const std::string& label, const std::vector<std::string>& files,
                       const std::string& root, const EmulatorParams& p) {
  DevicePart d;
  d.label = label;
  int n = 0;
  for (const auto& f : files) {
    for (const auto& r : evaluate_device_run(f, root, p)) {
      d.rows.push_back(r);
      d.time_rms += r.time_error * r.time_error;
      d.power_rms += r.power_error * r.power_error;
      ++n;
    }
  }
  d.time_rms = n > 0 ? std::sqrt(d.time_rms / n) : 0.0;
  d.power_rms = n > 0 ? std::sqrt(d.power_rms / n) : 0.0;
  return d;
}

std::string device_text(const DevicePart& d) {
  TextTable t({"workload", "partition", "SMs", "rounds", "measured ms", "emulated ms", "error",
               "measured W", "emulated W", "error", "min MHz", "reasons"});
  for (const auto& r : d.rows) {
    t.add_row({r.workload, r.partition, std::to_string(r.sms), std::to_string(r.rounds),
               fmt::format("{:.3f}", 1e3 * r.measured_time_s),
               fmt::format("{:.3f}", 1e3 * r.emulated_time_s), pct(r.time_error),
               fmt::format("{:.0f}", r.measured_power_w), fmt::format("{:.0f}", r.emulated_power_w),
               pct(r.power_error), std::to_string(r.measured_min_freq_mhz), r.reasons});
  }
  return fmt::format(
             "H200 partitions at 1980 MHz requested, collective as the copy proxy ({}): time RMS "
             "{:.1f}%, power RMS {:.1f}%\n",
             d.label, 100 * d.time_rms, 100 * d.power_rms) +
         t.render();
}

nlohmann::json device_json(const DevicePart& d) {
  nlohmann::json j;
  j["part"] = d.label;
  j["time_rms"] = d.time_rms;
  j["power_rms"] = d.power_rms;
  j["rows"] = nlohmann::json::array();
  for (const auto& r : d.rows) {
    j["rows"].push_back({{"workload", r.workload},
                         {"partition", r.partition},
                         {"measured_time_s", r.measured_time_s},
                         {"emulated_time_s", r.emulated_time_s},
                         {"time_error", r.time_error},
                         {"measured_power_w", r.measured_power_w},
                         {"emulated_power_w", r.emulated_power_w},
                         {"power_error", r.power_error},
                         {"measured_min_freq_mhz", r.measured_min_freq_mhz},
                         {"sms", r.sms},
                         {"rounds", r.rounds},
                         {"reasons", r.reasons}});
  }
  return j;
}

/// What `--artifact` and `--artifact-csv` take, owned by the subcommand's callback.
struct ArtifactArgs {
  std::string dir, csv, write_csv, source = "github.com/ml-energy/kareus commit 98f02558";
  std::vector<std::string> only;
  bool quiet = false;
};

/// The comment header of the CSV `--write-csv` writes.
std::vector<std::string> artifact_csv_comment(const std::string& source) {
  return {
      "Measured frontiers of the Kareus artifact (Wu, Chung, Chowdhury, OSDI '26), extracted by",
      "`kareus calibrate --artifact DIR --write-csv FILE` (scripts/extract-artifact-frontiers).",
      "Source: " + source + ", files",
      std::string("  tests/{perseus,nanobatch_perseus,kareus}/schedules/megatron_<model>/") +
          "cp<C>_tp<T>_mbs<M>_seq<S>/",
      "  frontier/{freqs,scheds}_pipeline_NNNNN.py, one frontier point per file, planned by the",
      "  authors' solver from profiles of real runs on 2 nodes x 8 A100 SXM4 40GB, PP=2.",
      "Licence: Apache-2.0 (the artifact's LICENSE), copyright its authors; numbers unchanged.",
      "Each file's '# Iteration N total cost: X' and '# Iteration N total cost with P2P: Y' give",
      "  energy_j    = Y: one GPU of each of the 2 pipeline stages, summed over the stages, static",
      "                included (whole-job energy = energy_j x GPUs per stage)",
      "  iter_time_s = (Y - X) / (2 x 85 W): the blocking energy at 85 W static power per stage",
      "workload: workloads/paper/<workload>.yaml; method: the artifact's folder (perseus =",
      "Megatron-LM + Perseus, nanobatch_perseus = Nanobatching + Perseus, kareus = Kareus).",
      "Rows sorted by workload, method, then time (fastest first). The fit/held-out split of",
      "issue 28 is artifact_set() in src/emulator/artifact.cc."};
}

/// --artifact / --artifact-csv: the measured frontiers against the emulated ones.
int run_artifact(const ArtifactArgs& a, bool json) {
  if (!a.csv.empty()) check_input_file("--artifact-csv", a.csv);
  std::vector<ArtifactFrontier> measured =
      a.csv.empty() ? read_artifact_frontiers(a.dir) : read_artifact_csv(a.csv);
  if (!a.only.empty()) {
    for (const auto& name : a.only) {
      if (std::none_of(measured.begin(), measured.end(),
                       [&name](const ArtifactFrontier& f) { return f.workload == name; })) {
        throw InvalidInput(fmt::format("--only {}: no such workload in the artifact", name));
      }
    }
    std::erase_if(measured, [&a](const ArtifactFrontier& f) {
      return std::find(a.only.begin(), a.only.end(), f.workload) == a.only.end();
    });
  }
  if (!a.write_csv.empty()) {
    check_output("--write-csv", a.write_csv, OutputKind::kFile);
    std::ofstream out(a.write_csv);
    if (!out) throw InvalidInput(fmt::format("--write-csv {}: cannot write", a.write_csv));
    write_artifact_csv(out, measured, artifact_csv_comment(a.source));
    std::cout << fmt::format("wrote {} ({} frontiers)\n", a.write_csv, measured.size());
    return 0;
  }
  std::vector<std::string> names;
  for (const auto& f : measured) {
    if (std::find(names.begin(), names.end(), f.workload) == names.end()) {
      names.push_back(f.workload);
    }
  }
  std::vector<Workload> workloads;
  for (const auto& name : names) {
    const std::string path = shipped_path("workloads/paper/" + name + ".yaml");
    check_input_file("workload of artifact " + name, path);
    workloads.push_back(load_job(path));
  }
  // The truth the frontiers would be planned from: exact measurements, default planner.
  ProfilingFlags exact;
  exact.noise = 0;
  exact.time_noise = 0;
  std::map<std::string, EmulatedWorkload> emulated;
  Progress bar("artifact workloads", workloads.size(), !a.quiet);
  const PlannerProgress poll = [](const std::string&, std::size_t, std::size_t) {
    throw_if_interrupted();
  };
  for (std::size_t i = 0; i < workloads.size(); ++i) {
    const Workload& w = workloads[i];
    ProfilingSession s = open_profiling(exact, w);
    emulated[names[i]] = {evaluate_workload(w, *s.cached, PlannerOptions{}, poll),
                          w.parallel.gpus_per_stage()};
    bar.update(i + 1);
  }
  bar.finish();
  const FidelityReport r = artifact_fidelity(measured, emulated);
  const GpuSpec& gpu = workloads.front().gpu();
  if (json) {
    nlohmann::json j = to_json(r);
    j["power_model"] = power_model_json(gpu);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fidelity_text(r) << power_model_text(gpu);
  return 0;
}

}  // namespace

void register_calibrate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("calibrate",
                                 "Fit the emulator to A100 iteration figures, stage profiles and "
                                 "the artifact's frontier ends");
  // Owned by the subcommand's callback.
  struct Args {
    std::string csv = kDefaultCsv, workload = kDefaultWorkload, profiles = kDefaultProfileDir;
    std::vector<std::string> fit = {"gpt3-175b"};
    bool per_clock = false, json = false, no_fit = false;
  };
  auto args = std::make_shared<Args>();
  auto art = std::make_shared<ArtifactArgs>();
  auto* csv_opt = cmd->add_option("CSV", args->csv, "calibration CSV (method,iter_time_s,energy_j)")
                      ->capture_default_str();
  cmd->add_option("--workload", args->workload, "workload the measurements belong to")
      ->capture_default_str();
  cmd->add_option("--profiles", args->profiles,
                  "folder with perseus_stage-profile_<model>_a100-sxm_bf16.csv files")
      ->capture_default_str();
  cmd->add_option("--fit", args->fit,
                  "stage profiles the fit uses (gpt3-175b, bloom-176b; 'none' for none); the "
                  "others are held out")
      ->capture_default_str();
  cmd->add_flag("--no-fit", args->no_fit,
                "report the errors of the committed parameters without refitting (seconds, where "
                "a fit takes minutes)");
  cmd->add_flag("--per-clock", args->per_clock, "print every clock, not every 90 MHz");
  cmd->add_flag("--json", args->json, "machine-readable output (every row)");
  auto* dir_opt = cmd->add_option(
      "--artifact", art->dir,
      "Kareus artifact checkout: compare its measured frontiers with the emulated ones "
      "(committed parameters, no fit)");
  auto* art_csv_opt =
      cmd->add_option("--artifact-csv", art->csv,
                      "the same from the extracted CSV (data/calibration/artifact_frontiers.csv)");
  auto* only_opt =
      cmd->add_option("--only", art->only, "with --artifact(-csv): only these workloads (A,B)")
          ->delimiter(',');
  auto* write_opt = cmd->add_option(
      "--write-csv", art->write_csv,
      "with --artifact: write the frontiers read as CSV to this file and stop (no emulation)");
  auto* source_opt = cmd->add_option("--artifact-source", art->source,
                                     "with --write-csv: the artifact's origin, for the CSV header")
                         ->capture_default_str();
  auto* quiet_opt =
      cmd->add_flag("--quiet", art->quiet, "with --artifact(-csv): no progress display");
  // The fit's options and the artifact's exclude each other; checked here, so that --help
  // stays a list of options.
  const std::vector<CLI::Option*> fit_opts = {csv_opt,
                                              cmd->get_option("--workload"),
                                              cmd->get_option("--profiles"),
                                              cmd->get_option("--fit"),
                                              cmd->get_option("--no-fit"),
                                              cmd->get_option("--per-clock")};
  const std::vector<CLI::Option*> artifact_opts = {only_opt, write_opt, source_opt, quiet_opt};
  cmd->callback([&action, args, art, dir_opt, art_csv_opt, write_opt, source_opt, fit_opts,
                 artifact_opts] {
    auto refuse = [&action](const std::string& why) {
      action = [why]() -> int { throw InvalidInput(why); };
    };
    const bool from_dir = dir_opt->count() > 0, from_csv = art_csv_opt->count() > 0;
    if (from_dir && from_csv) return refuse("--artifact and --artifact-csv exclude each other");
    if (from_dir || from_csv) {
      for (const auto* o : fit_opts) {
        if (o->count() > 0) {
          return refuse(
              fmt::format("{} is an option of the fit; --artifact and --artifact-csv "
                          "fit nothing",
                          o->get_name()));
        }
      }
      if (write_opt->count() > 0 && !from_dir) return refuse("--write-csv needs --artifact DIR");
      if (source_opt->count() > 0 && write_opt->count() == 0) {
        return refuse("--artifact-source needs --write-csv");
      }
      action = [args, art] { return run_artifact(*art, args->json); };
      return;
    }
    for (const auto* o : artifact_opts) {
      if (o->count() > 0) {
        return refuse(fmt::format("{} needs --artifact DIR or --artifact-csv FILE", o->get_name()));
      }
    }
    action = [args] {
      const bool json = args->json;
      const std::string csv = shipped_default(args->csv, kDefaultCsv);
      check_input_file("CSV", csv);
      const Workload w = load_workload(shipped_default(args->workload, kDefaultWorkload));
      const auto targets = read_calibration_targets(csv, w.gpu().max_freq_mhz);
      const std::string dir = shipped_default(args->profiles, kDefaultProfileDir);
      const auto models = perseus_stage_models();
      std::set<std::string> fit_models;
      for (const auto& m : args->fit) {
        if (m == "none") continue;
        if (std::find(models.begin(), models.end(), m) == models.end()) {
          throw InvalidInput(
              fmt::format("--fit {}: allowed values: gpt3-175b, bloom-176b, none", m));
        }
        fit_models.insert(m);
      }
      StageProfiles fit, held_out;
      for (const auto& m : models) {
        const std::string path = profile_path(dir, m);
        check_input_file("--profiles", path);
        (fit_models.count(m) ? fit : held_out).push_back({m, read_stage_profile(path)});
      }
      const std::vector<ArtifactCase> artifact = shipped_artifact_cases();
      const CalibrationResult r =
          args->no_fit ? evaluate_calibration(w, targets, EmulatorParams{},
                                              kPerseusStagePowerLimitW, fit, held_out, artifact)
                       : calibrate(w, targets, calibration_prior(), fit, held_out, artifact);
      EmulatorParams p = r.params;
      auto fields = p.fields();
      // H100/H200: the A100 fit with the H200 catalogue values, then sm_power_w and the kernel
      // efficiencies refitted on the measured partitions of the fit runs (the voltage curve
      // below 1980 MHz stays the catalogue estimate). The runs name their workload relative to
      // the source tree: resolve it where the first run was found.
      const std::string first_run = device_run_set().front().path;
      const std::string first = shipped_path(first_run);
      const std::string root =
          first == first_run ? "." : first.substr(0, first.size() - first_run.size() - 1);
      std::vector<std::string> dev_fit, dev_held;
      for (const auto& run : device_run_set()) {
        const std::string path = shipped_path(run.path);
        check_input_file("device run", path);
        (run.fit ? dev_fit : dev_held).push_back(path);
      }
      // The fitted H100/H200 fields; they and the power curve are the H200's, not the A100's.
      const char* const kHopperFitted[] = {"sm_power_w", "gemm_best_efficiency",
                                           "attn_fwd_best_efficiency", "attn_bwd_best_efficiency"};
      EmulatorParams hp = r.params;
      for (const char* name : kHopperFitted) *hp.fields().at(name) = 0;
      hp.voltage_ratio = hp.voltage_knee_mhz = hp.power_limit_w = 0;
      EmulatorParams committed_h200 = EmulatorModel(gpu_by_name("h200"), hp).params();
      if (!args->no_fit) hp = fit_device_params(dev_fit, root, hp).params;
      EmulatorParams fitted_h200 = EmulatorModel(gpu_by_name("h200"), hp).params();
      const DevicePart dev_fit_part = device_part("fit", dev_fit, root, hp);
      const DevicePart dev_held_part = device_part("held out", dev_held, root, hp);
      if (json) {
        nlohmann::json j;
        for (const auto& name : r.fitted) j["fitted"][name] = *fields.at(name);
        j["stage_power_limit_w"] = r.stage_power_limit_w;
        for (const char* name : kHopperFitted)
          j["h100_h200"][name] = *fitted_h200.fields().at(name);
        j["device_fit"] = device_json(dev_fit_part);
        j["device_held_out"] = device_json(dev_held_part);
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
        j["stage_profiles_fit"] = nlohmann::json::array();
        j["stage_profiles_held_out"] = nlohmann::json::array();
        for (const auto& x : r.fit_part) j["stage_profiles_fit"].push_back(profile_json(x));
        for (const auto& x : r.held_out) j["stage_profiles_held_out"].push_back(profile_json(x));
        j["artifact"] = artifact_residuals_json(r.artifact);
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      std::cout << (args->no_fit
                        ? std::string("committed parameters (not refitted):\n")
                        : fmt::format("fitted parameters ({} evaluations):\n", r.evaluations));
      for (const auto& name : r.fitted) {
        std::cout << fmt::format("  {:<20} {:.6g}\n", name, *fields.at(name));
      }
      if (!fit.empty()) {
        std::cout << fmt::format("  {:<20} {:.6g}  (profiled GPUs' board limit)\n",
                                 "stage_power_limit_w", r.stage_power_limit_w);
      }
      TextTable t(
          {"target", "measured s", "emulated s", "error", "measured J", "emulated J", "error"});
      for (const auto& x : r.residuals) {
        t.add_row({x.target.label, fmt::format("{:.3f}", x.target.time_s),
                   fmt::format("{:.3f}", x.time_s), pct(x.time_error),
                   fmt::format("{:.1f}", x.target.energy_j), fmt::format("{:.1f}", x.energy_j),
                   pct(x.energy_error)});
      }
      std::cout << "\nwhole iteration (" << w.name << ", " << w.gpu().display_name << "):\n"
                << t.render() << fmt::format("rms relative error {:.2f}%\n", 100 * r.rms_error);
      for (const auto& x : r.fit_part) {
        std::cout << "\n" << profile_text(x, "fit", args->per_clock);
      }
      for (const auto& x : r.held_out) {
        std::cout << "\n" << profile_text(x, "held out", args->per_clock);
      }
      std::cout << artifact_residuals_text(r.artifact);
      std::cout << fmt::format("\nH100/H200 on the H200 runs ({}):\n",
                               args->no_fit ? "catalogue values" : "fitted; catalogue in brackets");
      for (const char* name : kHopperFitted) {
        std::cout << fmt::format("  {:<26} {:.6g}  ({:.6g})\n", name,
                                 *fitted_h200.fields().at(name), *committed_h200.fields().at(name));
      }
      std::cout << device_text(dev_fit_part) << "\n" << device_text(dev_held_part);
      return 0;
    };
  });
}

}  // namespace kareus::cli
