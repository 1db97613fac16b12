// `kareus search FILE --partition KEY --strategy mbo|random|exhaustive --budget N --seed S`:
// searches one partition's configuration space and prints every measured point and the
// Pareto front on (time, energy).
//
// Ask/tell profiling (`--ask NEXT.csv`, usually with `--backend trace --trace MEASURED.csv`):
// the search replays from the start on every run (it is deterministic given its seed and the
// measurements) and stops at the first batch with points the trace lacks; it writes that whole
// batch to NEXT.csv and exits with kExitMeasurementsNeeded. Once MEASURED.csv holds every point
// the search wants, it prints exactly what a direct run with the same seeds prints.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <utility>

#include "cli_util.h"
#include "commands.h"
#include "kareus/error.h"
#include "kareus/evaluate.h"
#include "kareus/profiling_cost.h"
#include "kareus/progress.h"
#include "kareus/screening.h"
#include "kareus/search.h"
#include "kareus/table.h"
#include "profiling_flags.h"
#include "search_flags.h"

namespace kareus::cli {
namespace {

/// Exit code of `search --ask` when measurements are needed (documented in docs/cli.md).
constexpr int kExitMeasurementsNeeded = 3;
constexpr const char* kAskHeader = "partition,freq_mhz,sms,slot";
constexpr const char* kTraceHeader = "partition,freq_mhz,sms,slot,time_s,energy_j";

void write_ask_file(const std::string& path, const std::string& partition,
                    const std::vector<PartitionConfig>& configs) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw InvalidInput(fmt::format("--ask {}: cannot write the file", path));
  out << kAskHeader << "\n";
  for (const auto& c : configs) {
    out << fmt::format("{},{},{},{}\n", partition, c.freq_mhz, c.sms, c.slot);
  }
  out.close();
  if (!out) throw InvalidInput(fmt::format("--ask {}: cannot write the file", path));
}

/// The flags of `kareus search`, owned by the subcommand's callback.
struct SearchArgs {
  std::string file, partition, strategy = "mbo", ask;
  SearchOptions opt;
  bool json = false, quiet = false;
  ProfilingFlags flags;
  ScreeningFlags screening;
};

}  // namespace

nlohmann::json search_point_json(const SearchPoint& p) {
  return {{"freq_mhz", p.config.freq_mhz}, {"sms", p.config.sms},
          {"slot", p.config.slot},         {"time_s", p.m.time_s},
          {"energy_j", p.m.energy_j},      {"dynamic_energy_j", p.m.dynamic_energy_j},
          {"from_store", p.from_store}};
}

void register_search(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("search", "Search one partition for its time-energy Pareto front");
  auto args = std::make_shared<SearchArgs>();
  SearchArgs& a = *args;
  cmd->add_option("FILE", a.file, "workload YAML file")->required();
  cmd->add_option("--partition", a.partition, "partition key (see `kareus workload show`)")
      ->required();
  cmd->add_option("--strategy", a.strategy, "mbo, random or exhaustive")->capture_default_str();
  add_search_flags(cmd, a.opt, "measurements (the whole space if larger)");
  cmd->add_option("--ask", a.ask,
                  "ask/tell: write the next batch of points the backend lacks to this CSV "
                  "(partition,freq_mhz,sms,slot) and exit 3");
  cmd->add_flag("--json", a.json, "machine-readable output");
  cmd->add_flag("--quiet", a.quiet, "no progress bar");
  add_profiling_flags(cmd, a.flags);
  add_prior_flags(cmd, a.flags);
  add_screening_flags(cmd, a.screening);
  cmd->footer(
      "Exit codes: 0 done, 2 invalid input, 3 measurements needed (--ask: measure the points in "
      "the --ask file, append them to the --trace file, rerun).");
  cmd->callback([&action, args] {
    action = [args] {
      const std::string& file = args->file;
      const std::string& partition = args->partition;
      const std::string& strategy = args->strategy;
      const std::string& ask = args->ask;
      SearchOptions opt = args->opt;
      const bool json = args->json, quiet = args->quiet;
      const ProfilingFlags& flags = args->flags;
      auto strat = create_search_strategy(strategy);
      if (!ask.empty()) check_output("--ask", ask, OutputKind::kFile);
      // The ask/tell loop's first run creates the trace it will read.
      const bool new_trace = !ask.empty() && flags.backend == "trace" && !flags.trace.empty() &&
                             !std::filesystem::exists(flags.trace);
      if (new_trace) check_output("--trace", flags.trace, OutputKind::kFile);
      check_profiling_flags(flags);
      const bool screen = args->screening.on();
      const ScreeningOptions so =
          screen ? screening_options(args->screening, flags, !ask.empty()) : ScreeningOptions{};
      const Workload w = load_job(file);
      const PartitionSet ps = partition_workload(w);
      const Partition& p = ps.partition(partition);
      if (new_trace) {
        // The loop's first run: nothing measured yet.
        std::ofstream out(flags.trace);
        out << kTraceHeader << "\n";
        out.close();
        if (!out) throw InvalidInput(fmt::format("--trace {}: cannot write the file", flags.trace));
      }
      ProfilingSession session = open_profiling(flags, w);
      session.cached->set_ask_mode(!ask.empty());
      if (strategy == "mbo") opt.prior = session.prior;  // the others take no prior
      const SearchSpace space =
          make_search_space(p, session.backend->gpu(), space_options(*session.backend));
      const std::size_t expect =
          strategy == "exhaustive"
              ? space.size()
              : std::min<std::size_t>(space.size(),
                                      static_cast<std::size_t>(std::max(opt.budget, 1)));
      Progress bar(fmt::format("search {} ({})", p.key, strategy), expect, !quiet && ask.empty());
      SearchResult r;
      ScreenedSearch screened;
      const SearchProgress progress = [&](int done, int) {
        bar.update(static_cast<std::size_t>(done));
      };
      try {
        if (screen) {
          ScreeningSession sc = open_screening(flags, w, session, so);
          screened =
              screened_search(*strat, p, space, *sc.cached, *session.cached, opt, so, progress);
          r = std::move(screened.result);
        } else {
          r = strat->run(p, space, *session.cached, opt, progress);
        }
      } catch (const MeasurementsNeeded& need) {
        bar.finish();
        write_ask_file(ask, need.partition(), need.configs());
        std::cerr << fmt::format(
            "kareus: {} measurement(s) of {} needed: wrote {}; measure them, append the rows "
            "(partition,freq_mhz,sms,slot,time_s,energy_j) to {} and rerun\n",
            need.configs().size(), need.partition(), ask,
            flags.trace.empty() ? "the trace" : flags.trace);
        return kExitMeasurementsNeeded;
      }
      bar.finish();
      if (!ask.empty()) write_ask_file(ask, p.key, {});  // nothing more to measure
      // The recommended configurations: mbo's selection on its noise-shrunk estimates
      // (select_front), the measured Pareto set for the other strategies.
      const auto measured_front = r.front();
      const auto front = r.selected.empty() ? measured_front : r.selected;
      // What the same search costs on real GPUs: every point the search used, screened or not,
      // and the confirmations with the full window.
      const auto used = static_cast<std::size_t>(r.evaluations);
      const ProfilingCostEstimate cost =
          screen ? estimate_profiling_cost(screened.confirmed.size(), w.cluster.gpus_per_node, used,
                                           so.window_s, so.cooldown_s)
                 : estimate_profiling_cost(used, w.cluster.gpus_per_node);
      if (json) {
        nlohmann::json j;
        j["partition"] = p.key;
        j["strategy"] = r.strategy;
        j["space_size"] = space.size();
        j["evaluations"] = r.evaluations;
        j["resumed"] = r.resumed;
        j["batches"] = r.batches;
        j["stopped_early"] = r.stopped_early;
        j["surrogate_seconds"] = r.surrogate_seconds;
        j["prior"] = {{"name", r.prior},
                      {"beta_time", r.beta_time},
                      {"beta_dynamic_energy", r.beta_dynamic_energy},
                      {"beta_select_time", r.beta_select_time},
                      {"beta_select_energy", r.beta_select_energy},
                      {"seeded", r.prior_seeded}};
        j["points"] = nlohmann::json::array();
        for (const auto& pt : r.points) j["points"].push_back(search_point_json(pt));
        j["front"] = nlohmann::json::array();
        for (std::size_t i : front) {
          nlohmann::json pj = search_point_json(r.points[i]);
          if (!r.estimates.empty()) {
            const Measurement& e = r.estimates[i];
            pj["estimate"] = {{"time_s", e.time_s},
                              {"energy_j", e.energy_j},
                              {"dynamic_energy_j", e.dynamic_energy_j}};
          }
          j["front"].push_back(pj);
        }
        j["measured_front"] = nlohmann::json::array();
        for (std::size_t i : measured_front) {
          j["measured_front"].push_back(search_point_json(r.points[i]));
        }
        if (screen) {
          j["screening"] = {{"window_s", so.window_s},
                            {"cooldown_s", so.cooldown_s},
                            {"full_window_s", so.full_window_s},
                            {"screen_measured", screened.screen_measured},
                            {"confirm_measured", screened.confirm_measured},
                            {"confirmed", nlohmann::json::array()}};
          for (std::size_t k = 0; k < screened.confirmed.size(); ++k) {
            nlohmann::json cj = search_point_json(r.points[screened.confirmed[k]]);
            cj["full"] = {{"time_s", screened.full[k].time_s},
                          {"energy_j", screened.full[k].energy_j},
                          {"dynamic_energy_j", screened.full[k].dynamic_energy_j}};
            j["screening"]["confirmed"].push_back(cj);
          }
        }
        j["cost_estimate"] = cost.to_json();
        if (flags.backend == "emulator") j["power_model"] = power_model_json(w.gpu());
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      std::cout << fmt::format(
          "{}: {} of {} configurations measured with {} ({} from the store), {} recommended "
          "({} on the measured front)\n",
          p.key, r.evaluations, space.size(), r.strategy, r.resumed, front.size(),
          measured_front.size());
      if (screen) {
        std::cout << fmt::format(
            "screened with {:g} s windows, {} re-measured with {:g} s windows; the "
            "recommendation is from those\n",
            so.window_s, screened.confirmed.size(), so.full_window_s);
      }
      if (r.prior != "none") {
        std::cout << fmt::format(
            "prior: {} (weight in the last refit: time {:g}, dynamic energy {:g}; in the "
            "selection: time {:g}, energy {:g})\n",
            r.prior, r.beta_time, r.beta_dynamic_energy, r.beta_select_time, r.beta_select_energy);
      }
      std::cout << "profiling cost on real GPUs: " << cost.describe() << "\n";
      // With mbo's smoothed selection the estimates (what the planner composes) come first.
      const bool est = !r.estimates.empty();
      const std::string prefix = est ? "est. " : "";
      std::vector<std::string> head = {
          "freq MHz", "SMs", "slot", prefix + "time ms", prefix + "energy J", prefix + "dynamic J"};
      if (est) head.insert(head.end(), {"measured ms", "measured J"});
      TextTable t(head);
      for (std::size_t i : front) {
        const auto& pt = r.points[i];
        const Measurement& e = r.estimate(i);
        std::vector<std::string> row = {std::to_string(pt.config.freq_mhz),
                                        std::to_string(pt.config.sms),
                                        pt.config.slot,
                                        fmt::format("{:.4f}", 1e3 * e.time_s),
                                        fmt::format("{:.4f}", e.energy_j),
                                        fmt::format("{:.4f}", e.dynamic_energy_j)};
        if (est) {
          row.push_back(fmt::format("{:.4f}", 1e3 * pt.m.time_s));
          row.push_back(fmt::format("{:.4f}", pt.m.energy_j));
        }
        t.add_row(row);
      }
      std::cout << t.render();
      if (flags.backend == "emulator") std::cout << power_model_text(w.gpu());
      return 0;
    };
  });
}

}  // namespace kareus::cli
