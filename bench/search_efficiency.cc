// Search efficiency benchmark, scored by truth. For every distinct partition
// of the 14 paper workloads and every seed s, the emulator with its default noise (energy 1%,
// time 0.1%: an H200's repeatability) and noise seed s is the measuring profiler and the emulator
// without noise is the oracle. Each strategy runs once with the largest budget; budgets
// 28/56/112/168/224 are prefixes of that run (random search's order and mbo's schedule do not
// depend on the budget, see SearchOptions; each is on one of mbo's batch boundaries). At each
// budget the configurations the strategy recommends from its measured prefix (mbo: select_front;
// random: the measured Pareto set) are evaluated noise-free, and the hypervolume of those true
// values is divided by that of the true exhaustive front. Objectives are min-max scaled by the true
// values of the whole space, reference point 1.1 in each scaled objective. The old score (measured
// points against the noisy exhaustive front) is kept as a second number. The exhaustive search
// (every point measured once) is scored twice: its measured front, and what mbo's selection
// recommends from it; where the latter misses the target, the target asks for more than single
// measurements of every point tell.
//
// --dump-spaces DIR writes one JSON per partition for bench/search_peers.py (Optuna, BoTorch):
// the space, the true (time_s, energy_j) of every configuration and, per seed, the noisy
// measurement each would get. The emulator's noise is a pure function of (seed, partition,
// configuration), so these are exactly the values mbo and random see. Random search's order per
// seed is included, so that the Python scorer can be checked against this one.
//
// Warm starts (--warm, docs/search.md "Warm starts"): a third strategy, mbo-warm, is mbo with a
// prior (kareus/search_prior.h), scored like the others:
//   loo         the store prior, trained on the exhaustive noisy measurements (this noise, this
//               seed) of every partition of the same kind in the OTHER workloads of the suite
//               (leave one workload out; the partition's own signature is excluded too). The
//               related set is what ProfileStore::related returns for a store that holds them,
//               built in memory.
//   misleading  the same, every related measurement inverted (time, energy and dynamic energy
//               replaced by their reciprocals): a prior whose shape is the opposite of the truth.
//   emulator    sim-to-real: the measuring profiler and the oracle are a perturbed emulator
//               (perturbed_params below), the prior is the default emulator without noise.
// --max-budget N scores only the budgets up to N (and runs the searches only that far).
//
// Usage: search_efficiency [--seeds N] [--threads N] [--filter SUBSTRING[,SUBSTRING...]]
//          [--json FILE] [--jsonl FILE] [--dump-spaces DIR] [--noise X] [--time-noise X]
//          [--selection smoothed|measured]
//          [--smooth-random]
//          [--surrogate additive|trees] [--noise-rel X]
//          [--initial-design random|lhs] [--initial-points N] [--batch-size N]
//          [--measurement-weight W] [--smoothing-min-points N] [--stop-threshold X]
//          [--stop-patience N] [--clock-smoothing X] [--choice-pseudo-count X]
//          [--exploration optimistic|spread]
//          [--optimism K] [--warm none|loo|misleading|emulator] [--max-budget N]
//          [--explain N]
//
// --explain N prints, for every mbo run (and mbo-warm) at budget N, the measured points that
// its selection recommends or that lie on the true front of its measured points: their true
// values, the measurement's and the planner's estimate's errors against the truth, and the true
// hypervolume each true-front point would take with it. The header's score and coverage split a
// run's loss: coverage short of 1 was never measured, the score short of the coverage was
// measured and not recommended. Use it with --filter.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "bench_cli.h"
#include "kareus/emulator.h"
#include "kareus/search.h"

namespace {

std::vector<int> kBudgets = {28, 56, 112, 168, 224};

struct Job {
  std::string workload;
  std::string cls;  ///< partition class: "TP fwd_mlp", "CP bwd_a_rs", ...
  kareus::Partition partition;
  std::string gpu;
};

struct Stats {
  std::vector<double> v;  // per seed
  double mean() const {
    double s = 0;
    for (double f : v) s += f;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  double worst() const { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
};

struct Cell {
  Stats truth, noisy, coverage, used;
};

struct JobResult {
  std::string label, cls;
  std::size_t space = 0;
  std::map<std::string, std::map<int, Cell>> by;  // strategy -> budget -> per-seed scores
  Stats exhaustive_truth;                         // measured-front selection of everything
  Stats exhaustive_smoothed;                      // the same points, mbo's selection
  std::vector<double> surrogate_s;                // per mbo run at the largest budget (wall)
  std::vector<double> cpu_s;                      // the same runs' thread CPU time
  std::vector<std::string> prior_used;            // mbo-warm: the prior per seed ("none": no data)
  std::vector<std::vector<double>> beta;          // mbo-warm: beta time, dyn, select t, select e
  Stats prior_front;  // mbo-warm: the prior's own predicted front, before any measurement
};

// CPU seconds of the calling thread: on a shared machine wall time measures the neighbours.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string key(const kareus::PartitionConfig& c) {
  return fmt::format("{}|{}|{}", c.freq_mhz, c.sms, c.slot);
}

// A file name from a partition label ("llama...:fwd_mlp"): anything but [A-Za-z0-9._-] -> '_'.
std::string file_stem(const std::string& label) {
  std::string out = label;
  for (char& ch : out) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_')
      ch = '_';
  }
  return out;
}

// The emulator as the benchmark's profiler: `noise` on energy, `time_noise` on time (0 both: the
// oracle).
kareus::ProfilerOptions emulator_options(const std::string& gpu, double noise, double time_noise,
                                         std::uint64_t seed) {
  kareus::ProfilerOptions o;
  o.gpu = gpu;
  o.noise = noise;
  o.time_noise = time_noise;
  o.seed = seed;
  return o;
}

// The sim-to-real oracle of --warm emulator: the emulator with its uncertain parameters moved
// by an assumed uncertainty (docs/emulator.md gives sources, not error bars): the kernel
// efficiencies by 8-10% (the spread between cuBLAS / FlashAttention figures on A100 and what
// training steps reach), the fitted collective and overlap terms by 30-40%, per-launch and
// per-collective latencies by 50-67%, the activity terms of the power model by 40-100% and the
// HBM clock sensitivity by 67%. Each moves the shape of the response, not only its level.
kareus::EmulatorParams perturbed_params() {
  // The suite's GPU: the kernel efficiencies it resolves to are the A100's.
  kareus::EmulatorParams p =
      kareus::EmulatorModel(kareus::gpu_by_name("a100-sxm4-40gb"), {}).params();
  p.sm_power_w = p.voltage_ratio = p.voltage_knee_mhz = p.power_limit_w = 0;  // the GPU's
  p.gemm_best_efficiency *= 0.92;
  p.attn_fwd_best_efficiency *= 0.90;
  p.attn_bwd_best_efficiency *= 0.90;
  p.nccl_sms_to_saturate *= 1.3;
  p.overlap_slowdown *= 1.4;
  p.hbm_clock_sensitivity = 0.25;
  p.idle_activity *= 2.0;
  p.collective_activity *= 1.4;
  p.launch_overhead_s *= 1.5;
  p.collective_latency_s = 25e-6;
  return p;
}

// One run's --explain table (see the file comment): true_values[i] is the true (time_s,
// energy_j) of pts[i], est[i] the estimate handed to the planner, hv(idx) the score of a subset.
std::string explain_run(const std::string& title, const std::vector<kareus::SearchPoint>& pts,
                        const std::vector<kareus::Measurement>& est,
                        const std::vector<std::size_t>& selected,
                        const std::vector<kareus::Point2>& true_values,
                        const std::function<double(const std::vector<std::size_t>&)>& hv) {
  const std::vector<std::size_t> true_front = kareus::pareto_front(true_values);
  const std::set<std::size_t> sel(selected.begin(), selected.end());
  const std::set<std::size_t> tf(true_front.begin(), true_front.end());
  std::vector<std::size_t> all(pts.size());
  for (std::size_t i = 0; i < pts.size(); ++i) all[i] = i;
  std::string out = fmt::format(
      "{}: truth {:.4f}, coverage {:.4f}\n| point | MHz | SMs | slot | true time ms | true energy "
      "J | measured err time / energy | estimate err time / energy | true score lost without it "
      "|\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      title, hv(selected), hv(all));
  const double hv_front = hv(true_front);
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (!sel.count(i) && !tf.count(i)) continue;
    const auto& c = pts[i].config;
    const double t = true_values[i].x, e = true_values[i].y;
    double lost = 0;
    if (tf.count(i)) {
      std::vector<std::size_t> without;
      for (std::size_t j : true_front) {
        if (j != i) without.push_back(j);
      }
      lost = hv_front - hv(without);
    }
    out += fmt::format(
        "| {} | {} | {} | {} | {:.4f} | {:.4f} | {:+.2f}% / {:+.2f}% | {:+.2f}% / {:+.2f}% | {} "
        "|\n",
        sel.count(i) ? (tf.count(i) ? "selected, true front" : "selected") : "true front",
        c.freq_mhz, c.sms, c.slot, t * 1e3, e, 100 * (pts[i].m.time_s / t - 1),
        100 * (pts[i].m.energy_j / e - 1), 100 * (est[i].time_s / t - 1),
        100 * (est[i].energy_j / e - 1), tf.count(i) ? fmt::format("{:.4f}", lost) : "");
  }
  return out;
}

// Every distinct partition of the suite, with its workload: the pool of --warm loo's store.
struct PoolEntry {
  std::string workload;
  kareus::Partition partition;
  std::string gpu;
};

int run(int argc, char** argv) {
  int seeds = 5, threads = 1;
  double noise = kareus::kMeasuredNoiseRel.energy;
  double time_noise = -1;  // -1: kTimeNoiseShare x noise, as the emulator
  bool smooth_random = false;
  std::string filter, json_path, jsonl_path;  // jsonl: one line per partition as it finishes
  std::string dump_dir;
  kareus::SearchOptions base;
  std::string warm = "none";
  int max_budget = 224;
  int explain_budget = 0;  // --explain N: 0 explains nothing
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seeds")
      seeds = kareus::bench::flag_int(a, next());
    else if (a == "--threads")
      threads = kareus::bench::flag_int(a, next());
    else if (a == "--filter")
      filter = next();
    else if (a == "--json")
      json_path = next();
    else if (a == "--jsonl")
      jsonl_path = next();
    else if (a == "--dump-spaces")
      dump_dir = next();
    else if (a == "--noise")
      noise = kareus::bench::flag_double(a, next());
    else if (a == "--time-noise")
      time_noise = kareus::bench::flag_double(a, next());
    else if (a == "--selection")
      base.selection = next();
    else if (a == "--noise-rel")
      base.noise_rel = kareus::bench::flag_double(a, next());
    else if (a == "--surrogate")
      base.surrogate = next();
    else if (a == "--smooth-random")
      smooth_random = true;
    else if (a == "--initial-design")
      base.initial_design = next();
    else if (a == "--initial-points")
      base.initial_points = kareus::bench::flag_int(a, next());
    else if (a == "--batch-size")
      base.batch_size = kareus::bench::flag_int(a, next());
    else if (a == "--measurement-weight")
      base.measurement_weight = kareus::bench::flag_double(a, next());
    else if (a == "--smoothing-min-points")
      base.smoothing_min_points = kareus::bench::flag_int(a, next());
    else if (a == "--stop-patience")
      base.stop_patience = kareus::bench::flag_int(a, next());
    else if (a == "--stop-threshold")
      base.stop_threshold = kareus::bench::flag_double(a, next());
    else if (a == "--clock-smoothing")
      base.clock_smoothing = kareus::bench::flag_double(a, next());
    else if (a == "--choice-pseudo-count")
      base.choice_pseudo_count = kareus::bench::flag_double(a, next());
    else if (a == "--exploration")
      base.exploration = next();
    else if (a == "--optimism")
      base.optimism = kareus::bench::flag_double(a, next());
    else if (a == "--warm")
      warm = next();
    else if (a == "--max-budget")
      max_budget = kareus::bench::flag_int(a, next());
    else if (a == "--explain")
      explain_budget = kareus::bench::flag_int(a, next());
    else {
      fmt::print(stderr,
                 "usage: search_efficiency [--seeds N] [--threads N] [--filter S] [--json F] "
                 "[--jsonl F] [--dump-spaces DIR] [--noise X] [--time-noise X] [--selection "
                 "smoothed|measured] [--smooth-random] "
                 "[--surrogate additive|trees] [--noise-rel X] "
                 "[--initial-design random|lhs] [--initial-points N] [--batch-size N] "
                 "[--measurement-weight W] [--smoothing-min-points N] [--stop-threshold X] "
                 "[--stop-patience N] [--clock-smoothing X] [--choice-pseudo-count X] "
                 "[--exploration optimistic|spread] "
                 "[--optimism K] [--warm none|loo|misleading|emulator] [--max-budget N] "
                 "[--explain N]\n");
      return 2;
    }
  }
  if (warm != "none" && warm != "loo" && warm != "misleading" && warm != "emulator") {
    fmt::print(stderr, "--warm '{}': allowed none, loo, misleading, emulator\n", warm);
    return 2;
  }
  std::erase_if(kBudgets, [&](int b) { return b > max_budget; });
  if (kBudgets.empty()) {
    fmt::print(stderr, "--max-budget {}: below the smallest budget, 28\n", max_budget);
    return 2;
  }
  const bool emulated_real = warm == "emulator";
  const kareus::EmulatorParams oracle_params =
      emulated_real ? perturbed_params() : kareus::EmulatorParams{};
  // The prefixes' selections below see no backend: give them the noise the runs resolve to.
  if (time_noise < 0) time_noise = kareus::noise_with_time_share(noise).time;
  if (base.noise_rel < 0) base.noise_rel = noise;
  if (base.time_noise_rel < 0) base.time_noise_rel = time_noise;
  for (int b : kBudgets) {
    if (b > base.initial_points && (b - base.initial_points) % base.batch_size != 0) {
      fmt::print(stderr,
                 "warning: budget {} is not a batch boundary of mbo ({} + k x {}); its score is "
                 "that of the first {} points of a longer run\n",
                 b, base.initial_points, base.batch_size, b);
    }
  }
  std::vector<Job> jobs;
  std::vector<PoolEntry> suite;
  std::map<std::string, bool> seen, in_pool;
  std::vector<std::string> files;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KAREUS_SOURCE_DIR) + "/workloads/paper")) {
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const auto w = kareus::load_workload(f);
    const bool cp = w.name.find("_cp") != std::string::npos;
    for (const auto& p : kareus::partition_workload(w).partitions) {
      if (!in_pool[p.signature]) {
        in_pool[p.signature] = true;
        suite.push_back({w.name, p, w.gpu_name});
      }
      const std::string label = w.name + ":" + p.key;
      bool match = filter.empty();
      for (std::size_t a = 0, b = 0; !match && a <= filter.size(); a = b + 1) {
        b = filter.find(',', a);
        if (b == std::string::npos) b = filter.size();
        match = label.find(filter.substr(a, b - a)) != std::string::npos;
      }
      if (seen[p.signature] || !match) continue;
      seen[p.signature] = true;
      jobs.push_back({w.name, (cp ? "CP " : "TP ") + p.key, p, w.gpu_name});
    }
  }
  std::vector<std::string> strategies = {"mbo", "random"};
  if (warm != "none") strategies = {"mbo", "mbo-warm", "random"};
  // --warm loo / misleading: the exhaustive noisy measurements of a pool partition at one seed,
  // computed once.
  std::map<std::pair<std::string, int>, kareus::StoredPartition> stored;
  std::mutex stored_mu;
  auto stored_partition = [&](const PoolEntry& e, int seed) {
    std::lock_guard<std::mutex> lock(stored_mu);
    const auto k = std::make_pair(e.partition.signature, seed);
    if (auto it = stored.find(k); it != stored.end()) return it->second;
    kareus::EmulatorProfiler prof(
        emulator_options(e.gpu, noise, time_noise, static_cast<std::uint64_t>(seed)));
    kareus::StoredPartition sp{kareus::partition_shape(e.partition), prof.fingerprint(), {}};
    for (const auto& c : kareus::make_search_space(e.partition, prof.gpu()).configs()) {
      kareus::Measurement m = prof.measure(e.partition, c);
      if (warm == "misleading") {
        m.time_s = 1 / m.time_s;
        m.energy_j = 1 / m.energy_j;
        m.dynamic_energy_j = 1 / m.dynamic_energy_j;
      }
      sp.points.emplace_back(c, m);
    }
    return stored.emplace(k, std::move(sp)).first->second;
  };
  fmt::print(stderr,
             "{} distinct partitions, {} seeds, budgets {} (prefixes of one run), "
             "noise {} (time {})\n",
             jobs.size(), seeds, fmt::join(kBudgets, "/"), noise, time_noise);
  if (!dump_dir.empty()) std::filesystem::create_directories(dump_dir);
  std::vector<JobResult> results(jobs.size());
  std::atomic<std::size_t> next{0}, done{0};
  std::mutex print_mu;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (std::size_t j = next++; j < jobs.size(); j = next++) {
      const Job& job = jobs[j];
      JobResult& r = results[j];
      r.label = job.workload + ":" + job.partition.key;
      r.cls = job.cls;
      kareus::EmulatorProfiler oracle(emulator_options(job.gpu, 0.0, 0.0, 1), oracle_params);
      kareus::EmulatorProfiler exact_default(emulator_options(job.gpu, 0.0, 0.0, 1));
      const auto space = kareus::make_search_space(job.partition, oracle.gpu());
      r.space = space.size();
      // True values of the whole space.
      std::map<std::string, kareus::Point2> truth;
      kareus::Point2 lo{1e300, 1e300}, hi{-1e300, -1e300};
      std::vector<kareus::Point2> all_true;
      for (const auto& c : space.configs()) {
        const auto m = oracle.measure(job.partition, c);
        const kareus::Point2 q{m.time_s, m.energy_j};
        truth[key(c)] = q;
        all_true.push_back(q);
        lo = {std::min(lo.x, q.x), std::min(lo.y, q.y)};
        hi = {std::max(hi.x, q.x), std::max(hi.y, q.y)};
      }
      const double hv_true = kareus::normalized_hypervolume(all_true, lo, hi);
      auto true_hv = [&](const std::vector<kareus::SearchPoint>& pts,
                         const std::vector<std::size_t>& idx) {
        std::vector<kareus::Point2> q;
        for (std::size_t i : idx) q.push_back(truth.at(key(pts[i].config)));
        return kareus::normalized_hypervolume(q, lo, hi) / hv_true;
      };
      // The peers' oracle (--dump-spaces): the space in SearchSpace::configs() order.
      nlohmann::json dump;
      const auto configs = space.configs();
      std::map<std::string, std::size_t> index_of;
      if (!dump_dir.empty()) {
        dump = {{"partition", r.label},
                {"class", r.cls},
                {"workload", job.workload},
                {"gpu", job.gpu},
                {"noise", noise},
                {"time_noise", time_noise},
                {"space",
                 {{"freqs_mhz", space.freqs_mhz}, {"sms", space.sms}, {"slots", space.slots}}}};
        for (std::size_t i = 0; i < configs.size(); ++i) {
          const auto& c = configs[i];
          index_of[key(c)] = i;
          const auto& q = truth.at(key(c));
          dump["configs"].push_back({c.freq_mhz, c.sms, c.slot});
          dump["true"].push_back({q.x, q.y});
        }
      }
      for (int seed = 1; seed <= seeds; ++seed) {
        kareus::EmulatorProfiler prof(
            emulator_options(job.gpu, noise, time_noise, static_cast<std::uint64_t>(seed)),
            oracle_params);
        kareus::CachedProfiler cp(prof, nullptr);
        kareus::SearchOptions o = base;
        o.seed = static_cast<std::uint64_t>(seed);
        const auto ex =
            kareus::create_search_strategy("exhaustive")->run(job.partition, space, cp, o, {});
        r.exhaustive_truth.v.push_back(true_hv(ex.points, ex.selected));
        r.exhaustive_smoothed.v.push_back(
            true_hv(ex.points, kareus::select_front(ex.points, space, o)));
        kareus::Point2 nlo{1e300, 1e300}, nhi{-1e300, -1e300};
        std::vector<kareus::Point2> all_noisy;
        for (const auto& p : ex.points) {
          all_noisy.push_back({p.m.time_s, p.m.energy_j});
          nlo = {std::min(nlo.x, p.m.time_s), std::min(nlo.y, p.m.energy_j)};
          nhi = {std::max(nhi.x, p.m.time_s), std::max(nhi.y, p.m.energy_j)};
        }
        const double hv_noisy = kareus::normalized_hypervolume(all_noisy, nlo, nhi);
        nlohmann::json seed_dump;
        if (!dump_dir.empty()) {
          std::vector<std::vector<double>> measured(configs.size());
          for (const auto& p : ex.points)
            measured[index_of.at(key(p.config))] = {p.m.time_s, p.m.energy_j};
          seed_dump["measured"] = measured;
        }
        for (const auto& strat : strategies) {
          o.budget = kBudgets.back();
          kareus::SearchOptions ro = o;
          if (strat == "mbo-warm" && emulated_real) {
            ro.prior = kareus::make_profiler_prior(exact_default);
          } else if (strat == "mbo-warm") {
            ro.prior = kareus::make_store_prior(
                [&](const kareus::Partition& target) {
                  std::vector<kareus::StoredPartition> out;
                  for (const auto& e : suite) {
                    if (e.workload == job.workload || e.partition.key != target.key ||
                        e.partition.signature == target.signature)
                      continue;
                    out.push_back(stored_partition(e, seed));
                  }
                  return out;
                },
                static_cast<std::uint64_t>(seed));
          }
          const double cpu0 = thread_cpu_s();
          const auto res = kareus::create_search_strategy(strat == "mbo-warm" ? "mbo" : strat)
                               ->run(job.partition, space, cp, ro, {});
          if (strat == "mbo-warm") {
            r.prior_used.push_back(res.prior + (res.prior_seeded ? "+seeded" : ""));
            r.beta.push_back({res.beta_time, res.beta_dynamic_energy, res.beta_select_time,
                              res.beta_select_energy});
            // How good the prior is on its own: the Pareto set of its predictions, by truth.
            if (!res.prior_prediction.empty()) {
              std::vector<kareus::Point2> pred;
              std::vector<kareus::Point2> q;
              for (std::size_t i = 0; i < configs.size(); ++i) {
                pred.push_back(
                    {res.prior_prediction.log_time_s[i], res.prior_prediction.log_energy_j[i]});
              }
              for (std::size_t i : kareus::pareto_front(pred)) q.push_back(all_true[i]);
              r.prior_front.v.push_back(kareus::normalized_hypervolume(q, lo, hi) / hv_true);
            }
          }
          if (strat == "mbo") {
            r.surrogate_s.push_back(res.surrogate_seconds);
            r.cpu_s.push_back(thread_cpu_s() - cpu0);
          }
          if (!dump_dir.empty()) {
            std::vector<std::size_t> order;
            for (const auto& p : res.points) order.push_back(index_of.at(key(p.config)));
            seed_dump[strat + "_order"] = order;
          }
          for (int b : kBudgets) {
            const std::size_t n =
                std::min<std::size_t>(static_cast<std::size_t>(b), res.points.size());
            const std::vector<kareus::SearchPoint> prefix(res.points.begin(),
                                                          res.points.begin() + n);
            const bool is_mbo = strat == "mbo" || strat == "mbo-warm";
            kareus::SearchOptions so = o;
            if (!is_mbo && !smooth_random) so.selection = "measured";
            const auto sel =
                n == res.points.size() && is_mbo
                    ? res.selected
                    : kareus::select_front(
                          prefix, space, so,
                          res.prior_prediction.empty() ? nullptr : &res.prior_prediction);
            std::vector<std::size_t> every(n);
            std::vector<kareus::Point2> measured;
            for (std::size_t i = 0; i < n; ++i) {
              every[i] = i;
              measured.push_back({prefix[i].m.time_s, prefix[i].m.energy_j});
            }
            if (b == explain_budget && is_mbo) {
              std::vector<kareus::Point2> tv;
              tv.reserve(prefix.size());
              for (const auto& p : prefix) tv.push_back(truth.at(key(p.config)));
              const auto est = kareus::smoothed_estimates(
                  prefix, space, so,
                  res.prior_prediction.empty() ? nullptr : &res.prior_prediction);
              const std::string table = explain_run(
                  fmt::format("{} seed {} {} at {} points", r.label, seed, strat, b), prefix, est,
                  sel, tv,
                  [&](const std::vector<std::size_t>& idx) { return true_hv(prefix, idx); });
              std::lock_guard<std::mutex> lock(print_mu);
              fmt::print("{}\n", table);
            }
            Cell& c = r.by[strat][b];
            c.truth.v.push_back(true_hv(prefix, sel));
            c.coverage.v.push_back(true_hv(prefix, every));
            c.noisy.v.push_back(kareus::normalized_hypervolume(measured, nlo, nhi) / hv_noisy);
            c.used.v.push_back(static_cast<double>(n));
          }
        }
        if (!dump_dir.empty()) dump["seeds"][std::to_string(seed)] = seed_dump;
      }
      if (!dump_dir.empty()) {
        std::ofstream(std::filesystem::path(dump_dir) / (file_stem(r.label) + ".json"))
            << dump.dump() << "\n";
      }
      std::lock_guard<std::mutex> lock(print_mu);
      if (!jsonl_path.empty()) {
        nlohmann::json pj = {{"partition", r.label},
                             {"class", r.cls},
                             {"space", r.space},
                             {"exhaustive_truth", r.exhaustive_truth.v},
                             {"exhaustive_smoothed_truth", r.exhaustive_smoothed.v},
                             {"cpu_s", r.cpu_s},
                             {"prior", r.prior_used},
                             {"beta", r.beta},
                             {"prior_front_truth", r.prior_front.v}};
        for (const auto& [s, m] : r.by) {
          for (const auto& [b, c] : m) {
            pj[s][std::to_string(b)] = {{"truth", c.truth.v},
                                        {"noisy", c.noisy.v},
                                        {"coverage", c.coverage.v},
                                        {"used", c.used.v}};
          }
        }
        std::ofstream(jsonl_path, std::ios::app) << pj.dump() << std::endl;
      }
      std::string scores;
      for (const auto& s : strategies) {
        for (int b : {56, 112, 224}) {
          if (!r.by[s].count(b)) continue;
          scores += fmt::format(" {}@{} {:.4f} (worst {:.4f})", s, b, r.by[s][b].truth.mean(),
                                r.by[s][b].truth.worst());
        }
      }
      std::string betas;
      for (const auto& b : r.beta) betas += fmt::format(" {}", fmt::join(b, "/"));
      fmt::print(stderr, "[{}/{}] {:<42}{} | exhaustive {:.4f}, smoothed {:.4f}{}{}\n", ++done,
                 jobs.size(), r.label, scores, r.exhaustive_truth.mean(),
                 r.exhaustive_smoothed.mean(), r.prior_used.empty() ? "" : " | prior ",
                 fmt::join(r.prior_used, ","), betas.empty() ? "" : " beta t/d/st/se" + betas);
    }
  };
  kareus::bench::run_workers(threads, worker);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Per partition class: mean over its partitions and seeds, and the worst single run.
  std::map<std::string, std::vector<const JobResult*>> classes;
  for (const auto& r : results) classes[r.cls].push_back(&r);
  nlohmann::json j;
  auto agg = [](const std::vector<const JobResult*>& rs, const std::string& s, int b,
                Stats Cell::*field) {
    Stats out;
    for (const auto* r : rs) {
      const auto& v = (r->by.at(s).at(b).*field).v;
      out.v.insert(out.v.end(), v.begin(), v.end());
    }
    return out;
  };
  std::string rule;
  for (std::size_t i = 0; i < kBudgets.size(); ++i) rule += " --- |";
  fmt::print(
      "Truth-scored hypervolume fraction, mean over partitions x seeds (worst single run)\n\n"
      "| class | partitions | strategy | {} | noisy score {} |\n"
      "| --- | --- | --- |{} --- |\n",
      fmt::join(kBudgets, " | "), kBudgets.back(), rule);
  std::vector<const JobResult*> every;
  for (const auto& r : results) every.push_back(&r);
  classes["all"] = every;
  std::vector<std::string> losses;
  for (const auto& [cls, rs] : classes) {
    for (const auto& s : strategies) {
      std::string row = fmt::format("| {} | {} | {} |", cls, rs.size(), s);
      for (int b : kBudgets) {
        const Stats st = agg(rs, s, b, &Cell::truth);
        row += fmt::format(" {:.4f} ({:.4f}) |", st.mean(), st.worst());
        j["classes"][cls][s][std::to_string(b)] = {{"mean", st.mean()}, {"worst", st.worst()}};
      }
      row += fmt::format(" {:.4f} |", agg(rs, s, kBudgets.back(), &Cell::noisy).mean());
      fmt::print("{}\n", row);
    }
    for (int b : kBudgets) {
      if (agg(rs, "mbo", b, &Cell::truth).mean() < agg(rs, "random", b, &Cell::truth).mean())
        losses.push_back(fmt::format("{}@{}", cls, b));
    }
  }
  Stats ex, exs;
  for (const auto& r : results) {
    ex.v.insert(ex.v.end(), r.exhaustive_truth.v.begin(), r.exhaustive_truth.v.end());
    exs.v.insert(exs.v.end(), r.exhaustive_smoothed.v.begin(), r.exhaustive_smoothed.v.end());
  }
  fmt::print(
      "\nexhaustive (every point measured): measured front selected mean {:.4f}, worst {:.4f}; "
      "{} selection mean {:.4f}, worst {:.4f}\n",
      ex.mean(), ex.worst(), base.selection, exs.mean(), exs.worst());
  for (const auto& s : strategies) {
    fmt::print("coverage (true hypervolume of every measured point) {}:", s);
    for (int b : kBudgets) fmt::print(" {} {:.4f}", b, agg(every, s, b, &Cell::coverage).mean());
    fmt::print("\n");
  }
  if (base.stop_threshold > 0) {
    // A stopped search is scored at its last point; this is how many it measured.
    fmt::print("points measured by mbo with --stop-threshold {}:", base.stop_threshold);
    for (int b : kBudgets) fmt::print(" {} {:.1f}", b, agg(every, "mbo", b, &Cell::used).mean());
    fmt::print("\n");
  }
  double smax = 0, ssum = 0;
  std::size_t sn = 0;
  for (const auto& r : results) {
    for (double s : r.surrogate_s) {
      smax = std::max(smax, s);
      ssum += s;
      ++sn;
    }
  }
  double cmax = 0, csum = 0;
  for (const auto& r : results) {
    for (double c : r.cpu_s) {
      cmax = std::max(cmax, c);
      csum += c;
    }
  }
  fmt::print(
      "surrogate time of one {}-point mbo search: wall mean {:.3f} s, max {:.3f} s; CPU "
      "(whole search, emulator included) mean {:.3f} s, max {:.3f} s ({} searches)\n",
      kBudgets.back(), sn ? ssum / static_cast<double>(sn) : 0.0, smax,
      sn ? csum / static_cast<double>(sn) : 0.0, cmax, sn);
  fmt::print("mbo below random by class mean: {}\n",
             losses.empty() ? std::string("none") : fmt::format("{}", fmt::join(losses, " ")));
  if (warm != "none") {
    // Issue 33's acceptance at 56 points: every partition mean >= 0.995, worst seed >= 0.98.
    for (const std::string s : {"mbo", "mbo-warm"}) {
      fmt::print("{} partitions missing the 56-point target (mean >= 0.995, worst >= 0.98):", s);
      int miss = 0;
      for (const auto& r : results) {
        const auto& c = r.by.at(s).at(56).truth;
        if (c.mean() < 0.995 || c.worst() < 0.98) {
          fmt::print(" {}({:.4f}/{:.4f})", r.label, c.mean(), c.worst());
          ++miss;
        }
      }
      fmt::print("{}\n", miss ? "" : " none");
    }
    int worse = 0;
    fmt::print("partitions where mbo-warm is below mbo at 56 by mean:");
    for (const auto& r : results) {
      const double d = r.by.at("mbo-warm").at(56).truth.mean() - r.by.at("mbo").at(56).truth.mean();
      if (d < 0) {
        fmt::print(" {}({:+.4f})", r.label, d);
        ++worse;
      }
    }
    fmt::print("{}\n", worse ? "" : " none");
    Stats pf;
    for (const auto& r : results)
      pf.v.insert(pf.v.end(), r.prior_front.v.begin(), r.prior_front.v.end());
    fmt::print(
        "the prior's own predicted front, no measurement, by truth: mean {:.4f}, worst {:.4f} "
        "({} runs with a prior)\n",
        pf.mean(), pf.worst(), pf.v.size());
  }
  const bool full_target = std::count(kBudgets.begin(), kBudgets.end(), 112) &&
                           std::count(kBudgets.begin(), kBudgets.end(), 224);
  int fail = 0;
  if (full_target) {
    fmt::print(
        "partitions missing the target (mbo@112 mean >= 0.99, @224 mean >= 0.995, worst >= "
        "0.98):");
    for (const auto& r : results) {
      const auto& a = r.by.at("mbo").at(112).truth;
      const auto& b = r.by.at("mbo").at(224).truth;
      if (a.mean() < 0.99 || b.mean() < 0.995 || b.worst() < 0.98) {
        fmt::print(" {}({:.4f};{:.4f}/{:.4f})", r.label, a.mean(), b.mean(), b.worst());
        ++fail;
      }
    }
    // The information limit: partitions where measuring every point and selecting as mbo does
    // still misses the 224-point part of the target, so no search of 224 single measurements
    // with this selection is expected to meet it there.
    fmt::print("{}\n", fail ? "" : " none");
  }
  fmt::print("exhaustive with the {} selection missing the 224-point target:", base.selection);
  int ex_fail = 0;
  for (const auto& r : results) {
    const auto& e = r.exhaustive_smoothed;
    if (e.mean() < 0.995 || e.worst() < 0.98) {
      fmt::print(" {}({:.4f}/{:.4f})", r.label, e.mean(), e.worst());
      ++ex_fail;
    }
  }
  fmt::print("{}\n", ex_fail ? "" : " none");
  if (full_target) {
    fmt::print("{} of {} partitions meet it; ", results.size() - static_cast<std::size_t>(fail),
               results.size());
  }
  fmt::print("wall time {:.0f} s with {} thread(s)\n", wall, threads);
  if (!json_path.empty()) {
    for (const auto& r : results) {
      nlohmann::json pj = {{"partition", r.label}, {"class", r.cls}, {"space", r.space}};
      for (const auto& [s, m] : r.by) {
        for (const auto& [b, c] : m) {
          pj[s][std::to_string(b)] = {
              {"truth", c.truth.v}, {"noisy", c.noisy.v}, {"coverage", c.coverage.v}};
        }
      }
      pj["exhaustive_truth"] = r.exhaustive_truth.v;
      pj["exhaustive_smoothed_truth"] = r.exhaustive_smoothed.v;
      if (!r.prior_used.empty()) {
        pj["prior"] = r.prior_used;
        pj["beta"] = r.beta;
        pj["prior_front_truth"] = r.prior_front.v;
      }
      j["partitions"].push_back(pj);
    }
    j["surrogate_seconds_224"] = {{"mean", sn ? ssum / static_cast<double>(sn) : 0.0},
                                  {"max", smax}};
    j["cpu_seconds_224"] = {{"mean", sn ? csum / static_cast<double>(sn) : 0.0}, {"max", cmax}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kareus::bench::guarded_main("search_efficiency", [&] { return run(argc, argv); });
}
