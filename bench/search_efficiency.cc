// Search efficiency benchmark (issue 4): for every distinct partition of the 14 paper
// workloads, the hypervolume of the fronts measured by `mbo` and `random` at budgets 56, 112,
// 168 and 224, as a fraction of the exhaustive front's hypervolume, over 5 seeds, on the
// emulator with its default 1% noise. Objectives are min-max scaled by the exhaustive set and the
// reference point is 1.1 in each scaled objective, for all three strategies alike.
//
// Usage: search_efficiency [--seeds N] [--threads N] [--filter SUBSTRING[,SUBSTRING...]]
//                          [--json FILE] [--initial-design random|lhs] [--initial-points N]
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kareus/emulator.h"
#include "kareus/search.h"

namespace {

struct Job {
  std::string workload;
  kareus::Partition partition;
  std::string gpu;
};

struct Stats {
  std::vector<double> frac;  // per seed
  double mean() const {
    double s = 0;
    for (double f : frac) s += f;
    return frac.empty() ? 0 : s / static_cast<double>(frac.size());
  }
  double worst() const { return frac.empty() ? 0 : *std::min_element(frac.begin(), frac.end()); }
};

struct JobResult {
  std::string label;
  std::size_t space = 0;
  std::map<std::string, std::map<int, Stats>> by;  // strategy -> budget -> stats
  std::vector<double> surrogate_s_224;
};

}  // namespace

int main(int argc, char** argv) {
  int seeds = 5, threads = 2;
  std::string filter, json_path;
  kareus::SearchOptions base;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seeds")
      seeds = std::stoi(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--filter")
      filter = next();
    else if (a == "--json")
      json_path = next();
    else if (a == "--initial-design")
      base.initial_design = next();
    else if (a == "--initial-points")
      base.initial_points = std::stoi(next());
    else {
      fmt::print(stderr,
                 "usage: search_efficiency [--seeds N] [--threads N] [--filter S] [--json F]\n");
      return 2;
    }
  }
  const std::vector<int> budgets = {56, 112, 168, 224};
  std::vector<Job> jobs;
  std::map<std::string, bool> seen;
  std::vector<std::string> files;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KAREUS_SOURCE_DIR) + "/workloads/paper")) {
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const auto w = kareus::load_workload(f);
    for (const auto& p : kareus::partition_workload(w).partitions) {
      const std::string label = w.name + ":" + p.key;
      bool match = filter.empty();
      for (std::size_t a = 0, b = 0; !match && a <= filter.size(); a = b + 1) {
        b = filter.find(',', a);
        if (b == std::string::npos) b = filter.size();
        match = label.find(filter.substr(a, b - a)) != std::string::npos;
      }
      if (seen[p.signature] || !match) continue;
      seen[p.signature] = true;
      jobs.push_back({w.name, p, w.gpu_name});
    }
  }
  fmt::print(stderr, "{} distinct partitions, {} seeds, budgets 56/112/168/224\n", jobs.size(),
             seeds);
  std::vector<JobResult> results(jobs.size());
  std::atomic<std::size_t> next{0}, done{0};
  std::mutex print_mu;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (std::size_t j = next++; j < jobs.size(); j = next++) {
      const Job& job = jobs[j];
      kareus::EmulatorProfiler prof({job.gpu, 0.01, 1, 0, ""});
      kareus::CachedProfiler cp(prof, nullptr);
      const auto space = kareus::make_search_space(job.partition, prof.gpu());
      kareus::SearchOptions o = base;
      const auto ex =
          kareus::create_search_strategy("exhaustive")->run(job.partition, space, cp, o, {});
      kareus::Point2 lo{1e300, 1e300}, hi{-1e300, -1e300};
      std::vector<kareus::Point2> all;
      for (const auto& p : ex.points) {
        all.push_back({p.m.time_s, p.m.energy_j});
        lo = {std::min(lo.x, p.m.time_s), std::min(lo.y, p.m.energy_j)};
        hi = {std::max(hi.x, p.m.time_s), std::max(hi.y, p.m.energy_j)};
      }
      const double hv_ex = kareus::normalized_hypervolume(all, lo, hi);
      JobResult& r = results[j];
      r.label = job.workload + ":" + job.partition.key;
      r.space = space.size();
      for (const char* strat : {"mbo", "random"}) {
        auto s = kareus::create_search_strategy(strat);
        for (int b : budgets) {
          for (int seed = 1; seed <= seeds; ++seed) {
            o.budget = b;
            o.seed = static_cast<std::uint64_t>(seed);
            const auto res = s->run(job.partition, space, cp, o, {});
            std::vector<kareus::Point2> pts;
            for (const auto& p : res.points) pts.push_back({p.m.time_s, p.m.energy_j});
            r.by[strat][b].frac.push_back(kareus::normalized_hypervolume(pts, lo, hi) / hv_ex);
            if (std::string(strat) == "mbo" && b == 224)
              r.surrogate_s_224.push_back(res.surrogate_seconds);
          }
        }
      }
      std::lock_guard<std::mutex> lock(print_mu);
      fmt::print(stderr, "[{}/{}] {} mbo@224 mean {:.4f} worst {:.4f}, random@224 {:.4f}\n", ++done,
                 jobs.size(), r.label, r.by["mbo"][224].mean(), r.by["mbo"][224].worst(),
                 r.by["random"][224].mean());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Summary: per budget, over partitions: mean of means, worst partition mean, worst single run.
  fmt::print(
      "| strategy | budget | mean HV fraction (all partitions, seeds) | lowest partition mean | "
      "worst single run |\n| --- | --- | --- | --- | --- |\n");
  nlohmann::json j;
  for (const char* strat : {"mbo", "random"}) {
    for (int b : budgets) {
      double sum = 0, low_mean = 1e9, worst = 1e9;
      for (auto& r : results) {
        sum += r.by[strat][b].mean();
        low_mean = std::min(low_mean, r.by[strat][b].mean());
        worst = std::min(worst, r.by[strat][b].worst());
      }
      const double mean = sum / static_cast<double>(results.size());
      fmt::print("| {} | {} | {:.4f} | {:.4f} | {:.4f} |\n", strat, b, mean, low_mean, worst);
      j["summary"][strat][std::to_string(b)] = {
          {"mean", mean}, {"lowest_partition_mean", low_mean}, {"worst_run", worst}};
    }
  }
  double smax = 0, ssum = 0;
  std::size_t sn = 0;
  for (auto& r : results) {
    for (double s : r.surrogate_s_224) {
      smax = std::max(smax, s);
      ssum += s;
      ++sn;
    }
  }
  fmt::print(
      "\nsurrogate overhead of one 224-point mbo search: mean {:.3f} s, max {:.3f} s "
      "({} searches)\n",
      ssum / static_cast<double>(sn), smax, sn);
  fmt::print("partitions below target at 224 (mean < 0.99 or worst < 0.98):");
  int below = 0;
  for (auto& r : results) {
    if (r.by["mbo"][224].mean() < 0.99 || r.by["mbo"][224].worst() < 0.98) {
      fmt::print(" {}({:.4f}/{:.4f})", r.label, r.by["mbo"][224].mean(), r.by["mbo"][224].worst());
      ++below;
    }
  }
  fmt::print("{}\nwall time {:.0f} s with {} threads\n", below ? "" : " none", wall, threads);
  if (!json_path.empty()) {
    for (auto& r : results) {
      nlohmann::json pj = {{"partition", r.label}, {"space", r.space}};
      for (auto& [s, m] : r.by) {
        for (auto& [b, st] : m)
          pj[s][std::to_string(b)] = {{"mean", st.mean()}, {"worst", st.worst()}};
      }
      j["partitions"].push_back(pj);
    }
    j["surrogate_seconds_224"] = {{"mean", ssum / static_cast<double>(sn)}, {"max", smax}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}
