// A training job: model, GPU type, cluster, parallelism and batch shape, as read from a workload
// YAML file (see docs/cli.md for the format). Loading validates every field; a bad file throws
// InvalidInput naming the file, the key and what is allowed.
#pragma once

#include <string>
#include <vector>

#include "kareus/hw.h"

namespace kareus {

struct ModelConfig {
  std::string name;  ///< preset name, or "custom"
  int layers = 0;
  int hidden = 0;
  int ffn_hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  bool tied_embeddings = false;
  bool qk_norm = false;
};

struct ClusterConfig {
  int nodes = 1;
  int gpus_per_node = 8;
  int gpus() const { return nodes * gpus_per_node; }
};

struct ParallelConfig {
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int dp = 1;
  bool sequence_parallel = false;
  std::vector<int> stage_layers;  ///< layers per pipeline stage; sums to ModelConfig::layers
  /// GPUs that run one pipeline stage (tp * cp * dp): per-GPU figures of a stage times this
  /// give the stage's share of the job.
  int gpus_per_stage() const { return tp * cp * dp; }
};

struct BatchConfig {
  int micro_batch = 1;  ///< sequences per micro-batch
  int seq_len = 0;
  int micro_batches = 1;  ///< micro-batches per iteration (per data-parallel replica)
  int nano_batches = 2;   ///< 1 disables nano-batching; 2 is the Kareus execution model
};

enum class Recompute { kNone, kFull };

struct Workload {
  std::string name;    ///< file stem
  std::string source;  ///< path it was read from ("" when built in code)
  ModelConfig model;
  std::string gpu_name;
  ClusterConfig cluster;
  ParallelConfig parallel;
  BatchConfig batch;
  Recompute recompute = Recompute::kFull;

  const GpuSpec& gpu() const { return gpu_by_name(gpu_name); }
  /// Tokens processed per iteration by the whole job (all data-parallel replicas).
  double tokens_per_iteration() const;
};

/// Model presets: llama3.2-3b, qwen3-1.7b, llama3.3-70b. Throws InvalidInput on unknown name.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

/// Reads and validates a workload file. Throws InvalidInput. Every size has an upper limit that
/// every real training job fits (src/workload/workload.cc says which and why); a larger value
/// throws InvalidInput naming the key, the limit and the reason.
Workload load_workload(const std::string& path);
/// Parses and validates workload YAML text; `source` is used in error messages.
Workload parse_workload(const std::string& yaml_text, const std::string& source);
/// Validates a workload built in code (same rules as the file loader).
void validate_workload(const Workload& w);

}  // namespace kareus
