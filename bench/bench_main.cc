// Micro-benchmarks of the Kareus pipeline stages. Results and the machine they ran on are in
// docs/benchmarks.md; run with `make bench` (or build/release/bin/kareus_bench
// --benchmark_filter=...).
#include <benchmark/benchmark.h>

#include "kareus/emulator.h"
#include "kareus/partition.h"
#include "kareus/search_space.h"

namespace {

std::string paper(const char* name) {
  return std::string(KAREUS_SOURCE_DIR) + "/workloads/paper/" + name + ".yaml";
}

void BM_PartitionWorkload(benchmark::State& state) {
  const auto w = kareus::load_workload(paper("llama3.3-70b_tp8_mbs4_seq4096"));
  for (auto _ : state) benchmark::DoNotOptimize(kareus::partition_workload(w));
}
BENCHMARK(BM_PartitionWorkload)->Unit(benchmark::kMillisecond);

// One emulator evaluation of one partition configuration, cycling through the whole space of
// every partition of the calibration workload (issue 3 target: >= 100,000 per second, one core).
void BM_EmulatePartitionConfig(benchmark::State& state) {
  const auto w = kareus::load_workload(paper("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto ps = kareus::partition_workload(w);
  const kareus::EmulatorModel m(w.gpu());
  std::vector<std::pair<const kareus::Partition*, kareus::PartitionConfig>> work;
  for (const auto& p : ps.partitions) {
    for (const auto& c : kareus::make_search_space(p, w.gpu()).configs()) work.push_back({&p, c});
  }
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [p, c] = work[i];
    benchmark::DoNotOptimize(m.simulate_partition(*p, c));
    i = i + 1 == work.size() ? 0 : i + 1;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EmulatePartitionConfig);

// A whole 1F1B iteration of the calibration workload under the nano-batched schedule.
void BM_EmulateIteration(benchmark::State& state) {
  const auto w = kareus::load_workload(paper("llama3.2-3b_tp8_mbs8_seq4096"));
  const kareus::EmulatorModel m(w.gpu());
  for (auto _ : state) benchmark::DoNotOptimize(kareus::emulate_schedule(w, m, "nanobatch", 1410));
}
BENCHMARK(BM_EmulateIteration)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
