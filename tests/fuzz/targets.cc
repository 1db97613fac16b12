// Bodies of the libFuzzer targets (see targets.h). Inputs that a parser rejects must be
// rejected with InvalidInput; everything else escapes and is reported by libFuzzer.
#include "targets.h"

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kareus/error.h"
#include "kareus/kernel_graph.h"
#include "kareus/plan.h"
#include "kareus/plan_check.h"
#include "kareus/workload.h"
#include "profiler/builtin.h"

namespace kareus::fuzz {

const char* const kPlanWorkloadYaml =
    R"(model: {name: tiny, layers: 4, hidden: 256, ffn_hidden: 512, heads: 4, kv_heads: 2, head_dim: 64, vocab: 1024}
gpu: a100-sxm4-40gb
cluster: {nodes: 1, gpus_per_node: 4}
parallel: {tp: 2, pp: 2}
batch: {micro_batch: 2, seq_len: 512, micro_batches: 2}
)";

int workload_one_input(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Workload w = parse_workload(text, "fuzz.yaml");
    const KernelGraph g = build_kernel_graph(w);
    (void)g;
  } catch (const InvalidInput&) {
  }
  return 0;
}

int plan_one_input(const std::uint8_t* data, std::size_t size) {
  static const Workload w = parse_workload(kPlanWorkloadYaml, "tiny.yaml");
  // Malformed JSON is nlohmann's business (load_plan reports it as InvalidInput); the target
  // exercises what Kareus does with well-formed JSON of any shape.
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const Plan p = Plan::from_json(j, "fuzz.json");
    validate_plan(p, w, "fuzz.json");
  } catch (const InvalidInput&) {
  }
  return 0;
}

int trace_one_input(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const TraceTable t = parse_trace_csv(in, "fuzz.csv");
    (void)t;
  } catch (const InvalidInput&) {
  }
  return 0;
}

}  // namespace kareus::fuzz
