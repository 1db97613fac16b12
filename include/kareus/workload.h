// A training job: model, GPU type, cluster, parallelism and batch shape, as read from a workload
// YAML file (see docs/cli.md for the format). Loading validates every field; a bad file throws
// InvalidInput naming the file, the key and what is allowed.
#pragma once

#include <string>
#include <vector>

#include "kareus/hw.h"
#include "kareus/schedule.h"

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
  // Mixture of experts (docs/moe.md). experts == 0 is a dense model and the keys below are 0.
  int experts = 0;                   ///< routed experts per MoE layer
  int experts_per_token = 0;         ///< top-k
  int expert_ffn_hidden = 0;         ///< FFN width of one routed expert
  int shared_experts = 0;            ///< experts every token runs (DeepSeek-style)
  int shared_expert_ffn_hidden = 0;  ///< FFN width of one shared expert
  int dense_layers = 0;              ///< leading layers with a dense MLP (ffn_hidden)
  /// Tokens the busiest expert-parallel rank receives over the mean (1: balanced routing).
  /// Every rank waits for the busiest at the combine, so its load sets the time.
  double expert_imbalance = 1.0;
  bool moe() const { return experts > 0; }
  /// Whether global layer `layer` (0-based) has routed experts.
  bool moe_layer(int layer) const { return moe() && layer >= dense_layers; }
};

struct ClusterConfig {
  int nodes = 1;
  int gpus_per_node = 8;
  /// NCCL on the cluster as major * 100 + minor (cluster.nccl: "2.28"); the copy-engine
  /// all-to-all needs 2.28 or later.
  int nccl_version = 228;
  int gpus() const { return nodes * gpus_per_node; }
};

struct ParallelConfig {
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int dp = 1;
  /// Expert parallelism of MoE layers: the routed experts are split over ep ranks. The expert
  /// layers re-fold a stage's tp * cp * dp GPUs (Megatron-Core's MoE parallel folding, expert
  /// tensor parallelism 1): ep consecutive ranks form an expert-parallel group and the
  /// tp * cp * dp / ep groups hold the same experts (expert data parallelism).
  int ep = 1;
  bool sequence_parallel = false;
  /// Model chunks per pipeline stage (Megatron-LM's virtual pipeline stages): 1 is synchronous
  /// 1F1B, more is interleaved 1F1B (include/kareus/schedule.h).
  int virtual_pipeline = 1;
  /// Data-parallel gradient reduce-scatter and parameter all-gather overlap the backward and
  /// the forward (Megatron-LM's --overlap-grad-reduce and --overlap-param-gather); false runs
  /// them after the stage's last instruction.
  bool overlap_dp_comm = true;
  /// Layers per virtual stage (chunk c of stage s is virtual stage c * pp + s, so without
  /// interleaving one entry per stage); sums to ModelConfig::layers.
  std::vector<int> stage_layers;
  int virtual_stages() const { return pp * virtual_pipeline; }
  int stage_of(int virtual_stage) const { return virtual_stage % pp; }
  /// Layers stage s holds over all its chunks.
  int layers_of_stage(int stage) const;
  /// GPUs that run one pipeline stage (tp * cp * dp): per-GPU figures of a stage times this
  /// give the stage's share of the job.
  int gpus_per_stage() const { return tp * cp * dp; }
  /// Ranks that hold the same experts (tp * cp * dp / ep).
  int expert_dp() const { return gpus_per_stage() / ep; }
  /// The first global layer of virtual stage `virtual_stage`.
  int first_layer(int virtual_stage) const;
};

struct BatchConfig {
  int micro_batch = 1;  ///< sequences per micro-batch
  int seq_len = 0;
  int micro_batches = 1;  ///< micro-batches per iteration (per data-parallel replica)
  /// 1 disables nano-batching (frequency-only planning); 2 is the Kareus execution model. The
  /// file's default is 2, or 1 when micro_batch is 1 (one sequence cannot be split).
  int nano_batches = 2;
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
  /// The file marks the job as a what-if emulation (`what_if: true`): it need not fit the GPU's
  /// memory (e.g. the paper's 70B workloads on 16 A100 40GB, which the paper only emulated).
  bool what_if = false;

  const GpuSpec& gpu() const { return gpu_by_name(gpu_name); }
  /// The pipeline schedule the job runs: parallel.pp stages, parallel.virtual_pipeline chunks,
  /// batch.micro_batches.
  Schedule schedule() const;
  /// Tokens processed per iteration by the whole job (all data-parallel replicas).
  double tokens_per_iteration() const;
};

/// Per-GPU memory of a training job, in bytes, for the pipeline stage that needs the most
/// (src/workload/memory.cc gives the formulas and their sources). It is a lower bound: CUDA
/// context, NCCL buffers, the allocator's fragmentation and temporary buffers are not counted,
/// so a job over the GPU's memory by this estimate cannot run, while one under it may still not.
struct MemoryEstimate {
  int stage = 0;                           ///< the stage the figures are for (the largest)
  double parameters = 0;                   ///< parameters held by one GPU of that stage (count)
  double expert_parameters = 0;            ///< of which routed experts (sharded over ep)
  double weights_bytes = 0;                ///< bf16 weights, 2 bytes per parameter
  double gradients_bytes = 0;              ///< bf16 gradients, 2 bytes per parameter
  double optimizer_bytes = 0;              ///< Adam in fp32 (master weights, m, v): 12 B/param
  double optimizer_distributed_bytes = 0;  ///< the same sharded over dp (distributed optimizer;
                                           ///< routed experts over the expert-dp ranks)
  double activations_bytes = 0;            ///< stored activations under the recompute policy
  /// Micro-batch passes (through one chunk each when interleaved) whose activations the
  /// schedule keeps at once (Schedule::max_in_flight).
  int inflight_microbatches = 0;
  double hbm_bytes = 0;  ///< the GPU's memory
  /// weights + gradients + optimizer + activations, without and with a distributed optimizer.
  double total_bytes() const;
  double total_distributed_bytes() const;
  /// Whether the job fits with the distributed optimizer (the smaller of the two totals).
  bool fits() const { return total_distributed_bytes() <= hbm_bytes; }
};
/// Memory capacity of a catalogue GPU in bytes (datasheet figures; memory.cc cites them).
double gpu_memory_bytes(const std::string& gpu_name);
MemoryEstimate estimate_memory(const Workload& w);
/// Throws InvalidInput naming the workload file and every figure of estimate_memory unless the
/// job fits or the file is marked `what_if: true`.
void require_memory_fit(const Workload& w);
/// Warnings a person should see before planning (e.g. micro_batches < pp leaves stages idle);
/// empty when there are none. One line each, without a trailing newline.
std::vector<std::string> workload_warnings(const Workload& w);

/// Model presets: llama3.2-3b, qwen3-1.7b, llama3.3-70b and the mixtures of experts
/// mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b. Throws InvalidInput on unknown name.
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
