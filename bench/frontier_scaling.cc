// Frontier solver speed: the frontier of llama3.3-70b_tp8_mbs4_seq4096 with 18 clocks, and a
// scaling table over pipeline depth and micro-batch count (DAG nodes and edges, solver
// iterations, time per iteration). Instruction options come from the real pipeline (MBO search
// on the emulator, shared store); only the solver is timed, in wall and CPU seconds (the CPU
// time is what a shared, loaded machine does not distort).
//
// Usage: frontier_scaling [--max-pp N] [--max-mbs N] [--unit S] [--dump DIR]
// Rows use the unit S (default 1 ms) up to 256 pipeline-stage micro-batches (pp x micro-batches,
// e.g. pp8 x 32) and 2 S above (pp8 x 64, pp16 x 32, pp16 x 64). --dump DIR also writes each
// row's DAG to DIR/pp<P>_mb<M>.dag (text: "nodes N edges M gpus G static_power_w W", one line
// per node "stage kind microbatch k t1 e1 ... tk ek", one line per edge "from to"; numbers in
// shortest round-trip form), so that solvers can be compared on the same DAGs outside the
// pipeline.
#include <fmt/format.h>
#include <fmt/os.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "kareus/emulator.h"
#include "kareus/planner.h"

namespace {

void dump(const kareus::IterationDag& dag, const std::string& path) {
  auto f = fmt::output_file(path);
  f.print("nodes {} edges {} gpus {} static_power_w {}\n", dag.nodes.size(), dag.edges.size(),
          dag.gpus, dag.static_power_w);
  for (const auto& n : dag.nodes) {
    f.print("{} {} {} {}", n.stage, kareus::to_string(n.instruction), n.microbatch,
            n.options.size());
    for (const auto& o : n.options) f.print(" {} {}", o.time_s, o.energy_j);
    f.print("\n");
  }
  for (const auto& [a, b] : dag.edges) f.print("{} {}\n", a, b);
}

}  // namespace

int main(int argc, char** argv) {
  int max_pp = 16, max_mbs = 64;
  double unit = 1e-3;
  std::string dump_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-pp" && i + 1 < argc)
      max_pp = std::stoi(argv[++i]);
    else if (a == "--max-mbs" && i + 1 < argc)
      max_mbs = std::stoi(argv[++i]);
    else if (a == "--unit" && i + 1 < argc)
      unit = std::stod(argv[++i]);
    else if (a == "--dump" && i + 1 < argc)
      dump_dir = argv[++i];
    else {
      fmt::print(stderr,
                 "usage: frontier_scaling [--max-pp N] [--max-mbs N] [--unit S] [--dump DIR]\n");
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
    kareus::ProfilerOptions po;
    po.gpu = w.gpu_name;
    kareus::EmulatorProfiler prof(po);
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
      "{} solver iterations, {} frontier points, {:.3f} s ({:.3f} s CPU)\n\n",
      f.dag.nodes.size(), options, f.stats.iterations, f.points.size(), f.stats.seconds,
      f.stats.cpu_seconds);

  fmt::print(
      "| pp | micro-batches | DAG nodes | DAG edges | unit (ms) | iterations | frontier points | "
      "solver s | solver CPU s | CPU ms / iteration |\n");
  fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int pp = 2; pp <= max_pp; pp *= 2) {
    for (int mbs = 8; mbs <= max_mbs; mbs *= 2) {
      kareus::Workload w = w70;
      w.parallel.pp = pp;
      w.cluster.nodes = pp;  // tp 8 fills a node; one stage per node
      w.parallel.stage_layers.assign(static_cast<std::size_t>(pp), 80 / pp);
      w.batch.micro_batches = mbs;
      kareus::validate_workload(w);
      const double u = pp * mbs > 256 ? 2 * unit : unit;
      const auto r = run(w, u);
      if (!dump_dir.empty()) dump(r.dag, fmt::format("{}/pp{}_mb{}.dag", dump_dir, pp, mbs));
      fmt::print("| {} | {} | {} | {} | {:g} | {} | {} | {:.3f} | {:.3f} | {:.4f} |\n", pp, mbs,
                 r.dag.nodes.size(), r.dag.edges.size(), u * 1e3, r.stats.iterations,
                 r.points.size(), r.stats.seconds, r.stats.cpu_seconds,
                 1e3 * r.stats.cpu_seconds / std::max(1, r.stats.iterations));
    }
  }
  std::filesystem::remove(db);
  return 0;
}
