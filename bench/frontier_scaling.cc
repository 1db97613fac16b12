// Frontier solver speed (issue 5): the frontier of llama3.3-70b_tp8_mbs4_seq4096 with 18 clocks,
// and a scaling table over pipeline depth and micro-batch count. Instruction options come from
// the real pipeline (MBO search on the emulator, shared store); only the solver is timed.
//
// Usage: frontier_scaling [--max-pp N] [--max-mbs N] [--unit S]
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "kareus/emulator.h"
#include "kareus/planner.h"

int main(int argc, char** argv) {
  int max_pp = 16, max_mbs = 64;
  double unit = 1e-3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-pp" && i + 1 < argc)
      max_pp = std::stoi(argv[++i]);
    else if (a == "--max-mbs" && i + 1 < argc)
      max_mbs = std::stoi(argv[++i]);
    else if (a == "--unit" && i + 1 < argc)
      unit = std::stod(argv[++i]);
    else {
      fmt::print(stderr, "usage: frontier_scaling [--max-pp N] [--max-mbs N] [--unit S]\n");
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they finish
  const std::string root = KAREUS_SOURCE_DIR;
  const std::string db =
      (std::filesystem::temp_directory_path() / "kareus-frontier-bench.db").string();
  std::filesystem::remove(db);
  kareus::ProfileStore store(db);
  auto run = [&](const kareus::Workload& w, double u) {
    kareus::EmulatorProfiler prof({w.gpu_name, 0.01, 1, 0, ""});
    kareus::CachedProfiler cp(prof, &store);
    kareus::PlannerOptions o;
    o.unit_s = u;
    kareus::Planner planner(w, cp, o);
    return planner.frontier(kareus::Method::kKareus);
  };
  const auto w70 =
      kareus::load_workload(root + "/workloads/paper/llama3.3-70b_tp8_mbs4_seq4096.yaml");
  const auto f = run(w70, 1e-3);
  std::size_t options = 0;
  for (const auto& n : f.dag.nodes) options += n.options.size();
  fmt::print(
      "llama3.3-70b_tp8_mbs4_seq4096, 18 clocks, unit 1 ms: {} DAG nodes, {} options, "
      "{} solver iterations, {} frontier points, {:.3f} s\n\n",
      f.dag.nodes.size(), options, f.stats.iterations, f.points.size(), f.stats.seconds);

  fmt::print(
      "| pp | micro-batches | DAG nodes | unit (ms) | iterations | frontier points | solver s | ms "
      "/ iteration |\n");
  fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int pp = 2; pp <= max_pp; pp *= 2) {
    for (int mbs = 8; mbs <= max_mbs; mbs *= 2) {
      kareus::Workload w = w70;
      w.parallel.pp = pp;
      w.cluster.nodes = pp;  // tp 8 fills a node; one stage per node
      w.parallel.stage_layers.assign(static_cast<std::size_t>(pp), 80 / pp);
      w.batch.micro_batches = mbs;
      kareus::validate_workload(w);
      // Larger DAGs take more units to traverse; a coarser unit keeps the table's run short.
      const double u = unit * std::max(1, pp * mbs / 16);
      const auto r = run(w, u);
      fmt::print("| {} | {} | {} | {} | {} | {} | {:.3f} | {:.3f} |\n", pp, mbs, r.dag.nodes.size(),
                 u * 1e3, r.stats.iterations, r.points.size(), r.stats.seconds,
                 1e3 * r.stats.seconds / std::max(1, r.stats.iterations));
    }
  }
  std::filesystem::remove(db);
  return 0;
}
