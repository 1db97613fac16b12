// Micro-benchmarks of the Kareus pipeline stages (results in docs/benchmarks.md).
#include <benchmark/benchmark.h>

#include "kareus/partition.h"

namespace {

void BM_PartitionWorkload(benchmark::State& state) {
  const auto w = kareus::load_workload(std::string(KAREUS_SOURCE_DIR) +
                                       "/workloads/paper/llama3.3-70b_tp8_mbs4_seq4096.yaml");
  for (auto _ : state) benchmark::DoNotOptimize(kareus::partition_workload(w));
}
BENCHMARK(BM_PartitionWorkload)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
